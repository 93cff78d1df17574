"""PowerSGD (ringreduce/training/powersgd.py) at 2 ranks through the real rrun and MPI, against numpy."""

import json

import numpy as np
import pytest

from launch import run_job


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("powersgd")
    result = run_job(2, "training/powersgd.py", out, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    return ([dict(np.load(out / f"rank{r}.npz")) for r in range(2)],
            [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)])


def test_a_mean_of_rank_r_is_exact_at_rank_r_and_vectors_are_averaged_as_they_are(job):
    got, _ = job
    rng = np.random.default_rng(7)
    shared = rng.standard_normal((32, 2)).astype(np.float32)
    inputs = [shared @ np.random.default_rng(100 + r).standard_normal((2, 24)).astype(np.float32) for r in range(2)]
    for rank in range(2):
        np.testing.assert_allclose(got[rank]["exact-w"], np.mean(inputs, axis=0), rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(got[rank]["exact-b"], np.arange(10, dtype=np.float32) * 1.5)
    assert got[0]["exact-w"].tobytes() == got[1]["exact-w"].tobytes()  # every rank holds the same bits


def test_the_factors_are_what_travels(job):
    _, reports = job
    for report in reports:
        # P (32 x 2) and Q (24 x 2) in float32, and the vector as it is.
        assert report["wire"]["exact"] == (32 * 2 + 24 * 2 + 10) * 4
        # Plain steps send the whole matrix; low-rank ones P (16 x 1) and Q (16 x 1).
        assert [report["wire"][f"warm-{s}"] for s in range(4)] == [16 * 16 * 4] * 2 + [(16 + 16) * 4] * 2
        assert report["qs"] == {"w": [16, 1]}  # kept for the next step's warm start


def test_plain_steps_first_then_low_rank_with_error_feedback(job):
    got, _ = job
    for step in range(4):
        inputs = [got[r][f"warm-input-{step}"] for r in range(2)]
        for rank in range(2):
            result = got[rank][f"warm-{step}-w"]
            assert result.shape == (16, 8, 2)
            if step < 2:
                np.testing.assert_array_equal(result, (inputs[0] + inputs[1]) * np.float32(0.5))
            else:
                assert np.linalg.matrix_rank(result.reshape(16, 16), tol=1e-4) == 1
                # What the approximation missed of this rank's corrected gradient is kept: the
                # result plus the new residual is the input plus the last residual.
                corrected = inputs[rank].reshape(16, 16) + got[rank][f"warm-error-before-{step}"]
                kept = got[rank][f"warm-error-{step}"]
                assert np.abs(kept).max() > 0.1
                np.testing.assert_allclose(result.reshape(16, 16) + kept, corrected, rtol=0, atol=1e-5)
        assert got[0][f"warm-{step}-w"].tobytes() == got[1][f"warm-{step}-w"].tobytes()
