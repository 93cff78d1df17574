"""send, recv, isend and irecv through the real rrun and MPI at 3 ranks, against numpy: a ring
exchanged at once, receiving from any rank on several tags, a set's transfer while a collective
is pending on the same ranks, and each misuse, an error on both ends or before anything is sent."""

import json

import numpy as np
import pytest

import cases
from launch import python_of, run_job


@pytest.fixture(scope="module", params=["mpich", "openmpi"])
def job(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"p2p-{request.param}")
    result = run_job(3, "core/point_to_point.py", out, python=python_of(request.param), timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [dict(np.load(out / f"rank{r}.npz")) for r in range(3)]
    errors = [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]
    return ranks, errors


def test_a_ring_of_isend_and_irecv(job):
    ranks, _ = job
    for rank in range(3):
        left = (rank - 1) % 3
        np.testing.assert_array_equal(ranks[rank]["ring"], cases.values(left, "float64", 1001))
        assert int(ranks[rank]["ring-from"]) == left


def test_two_ranks_sending_to_each_other_at_once(job):
    ranks, _ = job
    for rank in (0, 1):
        for i in range(3):
            np.testing.assert_array_equal(ranks[rank][f"both-ways-{i}"],
                                          cases.values(1 - rank, "float32", 10 + (1 - rank) + 5 * i))


def test_recv_from_any_rank_on_several_tags_into_a_strided_view(job):
    ranks, _ = job
    for sender in (1, 2):
        for tag in (5, 6):
            np.testing.assert_array_equal(ranks[0][f"any-{sender}-{tag}"],
                                          cases.values(sender, "int32", 12, salt=tag).reshape(4, 3))


def test_a_sets_transfer_beside_a_pending_collective(job):
    ranks, _ = job
    np.testing.assert_array_equal(ranks[2]["pair"], np.arange(5, dtype=np.uint8))
    assert int(ranks[2]["pair-from"]) == 1
    for rank in range(3):
        np.testing.assert_array_equal(ranks[rank]["pending"], np.full(3, 3.0))
        np.testing.assert_array_equal(ranks[rank]["after"], np.full(2, 3.0))


def test_misuse_is_a_clear_error(job):
    _, errors = job
    expected = ("MismatchError", "send/recv with tag 9 does not match: rank 0 sends float32 (2, 3) but rank 1 "
                                 "receives into float64 (3, 2)")
    assert errors[0]["mismatch"] == list(expected) and errors[1]["mismatch"] == list(expected)
    for rank in range(3):
        assert errors[rank]["self"] == ["ValueError", f"send: rank {rank} is not another rank of this job"]
        assert errors[rank]["outside"] == ["ValueError", "send: rank 3 is not another rank of this job"]
        assert errors[rank]["tag"][0] == "ValueError" and "tag must be a whole number" in errors[rank]["tag"][1]
        assert errors[rank]["dtype"][0] == "UnsupportedDtypeError"
        assert errors[rank]["readonly"] == ["ValueError", "recv receives into a writeable numpy or CuPy array, "
                                                          "got ndarray (read-only)"]
    assert errors[0]["not-in-set"][0] == "ValueError" and "rank 0 is not in process set 1" in errors[0]["not-in-set"][1]


def test_a_rank_blocked_in_recv_or_in_another_sets_collective_is_no_deadlock():
    """Rank 0 waits in a collective of the whole job for rank 1, which waits in recv (then in a
    collective of set [1, 2]) for rank 2, which is computing: each rank is judged by what it waits
    for, so no DeadlockError, though each wait lasts longer than RINGREDUCE_DEADLOCK_TIME."""
    job = run_job(3, "core/waits_elsewhere.py", env={"RINGREDUCE_DEADLOCK_TIME": "1"}, timeout=60)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(3):
        assert job.lines_of(rank) == ["recv: sum [3.0, 3.0]", "set: sum [3.0, 3.0]"]
