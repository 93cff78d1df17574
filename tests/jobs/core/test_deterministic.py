"""RINGREDUCE_DETERMINISTIC: every float sum adds the ranks' values in rank order, element by
element, under every family, piece size and place in a fused buffer (tests/jobs/core/deterministic.py),
so its bits are those of numpy adding them in rank order; without it, the ring's are not."""

import numpy as np
import pytest

from ringreduce.machine.layout import even_counts, offsets_of

import cases
from launch import run_job

LENGTH = 40_001
# (ranks, family, piece bytes): every family at 3 ranks, two at 4, the ring in small pieces.
ON = [(3, "ring", None), (3, "shm", None), (3, "halving_doubling", None), (3, "tree", None), (3, "mpi", None),
      (3, "ring", 4096), (4, "auto", None), (4, "shm", None)]


def run(tmp_path, ranks, family, piece, deterministic):
    env = {"RINGREDUCE_ALGORITHM": family, "RINGREDUCE_DETERMINISTIC": "1" if deterministic else "0"}
    if piece:
        env.update(RINGREDUCE_PIPELINE_CHUNK_BYTES=str(piece), RINGREDUCE_SHM_PIECE_BYTES=str(piece))
    job = run_job(ranks, "core/deterministic.py", tmp_path, env=env, timeout=90)
    assert job.returncode == 0, job.stderr[-3000:]
    return [dict(np.load(tmp_path / f"rank{rank}.npz")) for rank in range(ranks)]


def expected(ranks):
    total = cases.rank_order_sum([cases.mixed_magnitudes(rank, LENGTH) for rank in range(ranks)])
    return total, cases.average(total, ranks)


def bits(array):
    return np.ascontiguousarray(array).view(np.uint32)


@pytest.mark.parametrize("ranks, family, piece", ON)
def test_every_float_sum_is_the_rank_order_sum_bit_for_bit(tmp_path, ranks, family, piece):
    total, mean = expected(ranks)
    rows = offsets_of(even_counts(LENGTH, ranks))
    for rank, got in enumerate(run(tmp_path, ranks, family, piece, deterministic=True)):
        for case in ("alone", "behind_odd", "in_group"):
            assert np.array_equal(bits(got[case]), bits(total)), (rank, case)
        assert np.array_equal(bits(got["average"]), bits(mean)), rank
        assert np.array_equal(bits(got["reducescatter"]), bits(total[rows[rank]:rows[rank + 1]])), rank


def test_without_the_switch_the_ring_adds_in_an_order_of_its_own(tmp_path):
    """So the test above can fail: the same sums on the ring, switch off, differ from the rank-order
    sum, and from each other where the tensor lies elsewhere in a fused buffer."""
    total, _ = expected(3)
    got = run(tmp_path, 3, "ring", None, deterministic=False)[0]
    assert not np.array_equal(bits(got["alone"]), bits(total))
    assert not np.array_equal(bits(got["alone"]), bits(got["behind_odd"]))


def test_training_repeated_with_other_fusion_and_timing_ends_bitwise_equal(tmp_path):
    """A 3-rank torch run, repeated with fusion off and a short cycle, then with fusion on and a
    long one, under other families: the same parameters to the last bit."""
    runs = [{"RINGREDUCE_FUSION_THRESHOLD": "0", "RINGREDUCE_CYCLE_TIME": "0.2", "RINGREDUCE_ALGORITHM": "ring"},
            {"RINGREDUCE_FUSION_THRESHOLD": str(64 << 20), "RINGREDUCE_CYCLE_TIME": "20",
             "RINGREDUCE_ALGORITHM": "auto"}]
    digests = []
    for variables in runs:
        job = run_job(3, "core/deterministic_training.py", env={"RINGREDUCE_DETERMINISTIC": "1", **variables},
                      timeout=120)
        assert job.returncode == 0, job.stderr[-3000:]
        digests.append(job.lines_of(0))
    assert digests[0] == digests[1] and digests[0][0].startswith("parameters "), digests
