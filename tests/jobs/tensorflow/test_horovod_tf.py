"""horovod.tensorflow's behaviour under ringreduce.tensorflow at 1, 2 and 3 ranks, through rrun
and MPI, each result compared with a reference computed here."""

import json

import numpy as np
import pytest

import cases  # noqa: E402
from launch import run_job  # noqa: E402


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_horovod_style_tensorflow(np_, tmp_path):
    job = run_job(np_, "tensorflow/horovod_tf.py", tmp_path, timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    x = [np.arange(6, dtype=np.float32) * (r + 1) for r in range(np_)]
    total = sum(x)
    for rank in range(np_):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        np.testing.assert_allclose(got["positional"], total)
        np.testing.assert_allclose(got["average-false"], total)
        assert got["warned"] == [True]
        np.testing.assert_allclose(got["compressed"], total)
        np.testing.assert_allclose(got["fp16"], total, rtol=1e-3)
        for dtype in ("int32", "int64"):
            assert got[f"dtypes-{dtype}"] == dict.fromkeys(
                ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter"), dtype)
        # Every rank's slices gathered, values divided by the size (Average); applied, they add up.
        assert got["slices"]["indices"] == [i for r in range(np_) for i in range(r + 1)]
        dense = np.zeros((4, 2))
        for r in range(np_):
            dense[:r + 1] += (r + 1) / np_
        np.testing.assert_allclose(got["slices"]["dense"], dense)
        assert got["ops"] == [np_, rank, np_, rank]
        expected_errors = {"slices-min": ["NotImplementedError"], "slices-scaled": ["NotImplementedError"]}
        if np_ > 1:
            expected_errors.update(eager=["FailedPreconditionError", "MismatchError"],
                                   function=["FailedPreconditionError"], session=["FailedPreconditionError"])
        assert got["errors"] == expected_errors
        assert got["executing_eagerly"] is True
        # d loss / d output = rank + 1 on every rank: the shared kernel gets the average over ranks
        # (times the embedding's ones), the local embedding its own divided by the size.
        mean = np.mean([r + 1 for r in range(np_)])
        np.testing.assert_allclose(got["partial_tape"]["shared"], [[mean], [mean]])
        local = np.zeros((4, 2))
        local[rank % 4] = (rank + 1) / np_
        np.testing.assert_allclose(got["partial_tape"]["local"], local)
        # One SGD step of 1.0: the shared weight by the mean gradient, the local one by its own / size.
        np.testing.assert_allclose(got["keras_local"], [[-mean], [-(rank + 1) / np_]])
        assert got["callback_local"] == [[[np_ - 1.0], [np_ - 1.0]], [float(rank)]]
        assert got["elastic_restore"] == [[[np_ - 1.0], [np_ - 1.0]], 0]  # rank 0's, after the callback
        if np_ > 1:
            kind, is_mismatch, message = got["op_error"]
            assert kind == "MismatchError" and is_mismatch
            assert "allreduce 'mismatched' does not match across ranks: shape" in message
        np.testing.assert_allclose(got["broadcast_"], [np_ - 1.0] * 3)
        np.testing.assert_allclose(got["keras_values"], np.arange(3.0) * sum(r + 1 for r in range(np_)))
        assert got["eager_global_variables"].startswith("broadcast_global_variables() does not support eager")
        assert got["graph_independent"] == [[float(sum(r + i for r in range(np_)))] for i in range(8)]
        assert got["graph_broadcast"] == [0.0, 1.0]  # rank 0's weights, everywhere
        # Horovod's rule: the average over ranks of the gradient (ones) on the root, zero elsewhere.
        assert got["graph_broadcast_grads"] == [[1.0 if r == rank else 0.0] * 3 for r in range(np_)]
        # One step of 0.5 * the mean over ranks of the gradient d(f . w)/dw = f = [1 + r, 2].
        mean_gradient = np.mean([[1.0 + r, 2.0] for r in range(np_)], axis=0)
        np.testing.assert_allclose(got["graph_step"], np.array([0.0, 1.0]) - 0.5 * mean_gradient, rtol=1e-6)
        for key, expected in cases.expected_gradients(rank, np_).items():
            np.testing.assert_allclose(got["grads"][key], expected, err_msg=key)

