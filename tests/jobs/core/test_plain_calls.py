"""Plain calls in program order (ringreduce/engine/plain_calls.py) through the real rrun and MPI: small
allreduces and barriers run without the engine, everything else is checked there and then run by
the engine; every result against numpy and the same bit for bit on every rank; a joined rank
answering; and the ways a wait there ends: a peer blocked elsewhere, a peer that left, a stall."""

import json
import re

import numpy as np
import pytest

from ringreduce.machine.layout import even_counts

import cases
from launch import run_job, site_in


def run(size, mode, tmp_path, env=None, arrays=True):
    job = run_job(size, "core/plain_calls.py", mode, tmp_path, env=env, timeout=90)
    assert job.returncode == 0, job.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(size)]
    got = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(size)] if arrays else None
    return job, reports, got


@pytest.mark.parametrize("size", [2, 3, 4])
def test_plain_calls_match_numpy_bit_for_bit_on_every_rank(size, tmp_path):
    _, reports, got = run(size, "results", tmp_path)
    for where, members in (("global", range(size)), ("ends", cases.ends(size))):
        for dtype in cases.DTYPES:
            for op in cases.BOOL_OPS if dtype == "bool" else cases.OPS:
                expected = cases.reference_reduce([cases.values(r, dtype, 33) for r in members], op)
                for rank in members:
                    np.testing.assert_array_equal(got[rank][f"{where}-{dtype}-{op}"], expected, err_msg=(where, rank))
        inputs = [cases.normal(r, "float32", 257) for r in members]
        expected = cases.average(np.add.reduce(np.stack(inputs) * np.float32(0.5), axis=0), len(members)) * 3
        for rank in members:
            mine = got[rank]
            np.testing.assert_allclose(mine[f"{where}-scaled"], expected, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(mine[f"{where}-scaled"], mine[f"{where}-scaled-async"], rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(mine[f"{where}-in-place"], np.sum(
                [cases.values(r, "int64", 9).reshape(3, 3) for r in members], axis=0))
            assert reports[rank][f"{where}-in-place-same-array"] is True
            assert mine[f"{where}-scalar"].shape == () and mine[f"{where}-scalar"] == sum(r + 1 for r in members)
        for key in got[members[0]]:  # every rank of the set holds the same bits, whatever the order of reduction
            if key.startswith(where):
                for rank in members:
                    assert got[rank][key].tobytes() == got[members[0]][key].tobytes(), (key, rank)
    small = sum(len(cases.BOOL_OPS if d == "bool" else cases.OPS) for d in cases.DTYPES) + 4  # + scaled, in place,
    for rank in range(size):                                                                # scalar, barrier
        assert reports[rank]["small-ran-in-order"] == small
        # The large allreduce, reducescatter and broadcast ran after the meeting; the compressed
        # allreduce in the engine.
        assert reports[rank]["large-ran-in-order"] == 3
        np.testing.assert_array_equal(got[rank]["large"], np.sum(
            [cases.values(r, "float32", 100_000) for r in range(size)], axis=0))
        rows = even_counts(30_001, size)
        np.testing.assert_array_equal(got[rank]["large-scattered"], np.sum(
            [cases.values(r, "float64", 30_001) for r in range(size)], axis=0)[
                sum(rows[:rank]):sum(rows[:rank + 1])].reshape(-1, 1))
        np.testing.assert_array_equal(got[rank]["large-broadcast"], cases.values(size - 1, "int16", 70_000))
        np.testing.assert_array_equal(got[rank]["compressed"], np.sum(
            [cases.values(r, "float32", 10) for r in range(size)], axis=0))
    for where, members in (("global", list(range(size))), ("ends", cases.ends(size))):
        for rank in members:
            mine, said = got[rank], reports[rank]
            np.testing.assert_array_equal(mine[f"{where}-gathered"], np.concatenate(
                [cases.values(r, "int32", 3 * r).reshape(r, 3) for r in members]))
            for root in members:
                np.testing.assert_array_equal(mine[f"{where}-broadcast-{root}"], cases.values(root, "float64", 5))
                np.testing.assert_array_equal(mine[f"{where}-broadcast_-{root}"],
                                              cases.values(root, "uint8", 6).reshape(2, 3))
                assert said[f"{where}-broadcast_-{root}-same-array"] is True
            np.testing.assert_array_equal(mine[f"{where}-other-sites"], np.full(4, sum(r + 1.0 for r in members)))
            position, rows = members.index(rank), even_counts(7, len(members))
            mine_rows = slice(sum(rows[:position]), sum(rows[:position + 1]))
            np.testing.assert_array_equal(mine[f"scattered-{where}"], np.sum(
                [cases.values(r, "int64", 14).reshape(7, 2) for r in members], axis=0)[mine_rows])
            rows = even_counts(5, len(members))
            mine_rows = slice(sum(rows[:position]), sum(rows[:position + 1]))
            expected = np.add.reduce([cases.normal(r, "float32", 15).reshape(5, 3) * np.float32(0.5) for r in members])
            np.testing.assert_allclose(mine[f"scattered-average-{where}"], expected[mine_rows] / len(members) * 3,
                                       rtol=1e-5, atol=1e-6)
            if where == "global":  # the whole job's set is the one counted
                # The allgather, a broadcast and a broadcast_ from each root, the allreduce and the two
                # reducescatters: all in the meeting; then the allgather too large to carry, after it.
                assert said["global-gathered-ran-in-order"] == 4 + 2 * size, said
                assert said["global-gathered-large-ran-in-order"] == 5 + 2 * size, said
            np.testing.assert_array_equal(mine[f"{where}-gathered-large"], np.concatenate(
                [np.full((20_000 if r == members[-1] else 1, 2), r, np.float32) for r in members]))
            rows = even_counts(5, len(members))
            mine_rows = slice(sum(rows[:position]), sum(rows[:position + 1]))
            for repeat, root in enumerate([members[0], members[0], members[-1], members[0]]):
                np.testing.assert_array_equal(mine[f"repeat-{where}-{repeat}-gathered"], np.concatenate(
                    [cases.values(r, "int32", 2 * (r + 1)).reshape(r + 1, 2) + repeat for r in members]))
                np.testing.assert_array_equal(mine[f"repeat-{where}-{repeat}-broadcast"],
                                              cases.values(root, "float64", 5) + repeat)
                np.testing.assert_array_equal(mine[f"repeat-{where}-{repeat}-broadcast_"],
                                              cases.values(root, "uint8", 6) + np.uint8(repeat))
                expected = np.add.reduce([(cases.normal(r, "float32", 15).reshape(5, 3) + repeat) * np.float32(0.5)
                                          for r in members])
                np.testing.assert_allclose(mine[f"repeat-{where}-{repeat}-scattered"],
                                           expected[mine_rows] / len(members) * 3, rtol=1e-5, atol=1e-6)
            if where == "global":  # every kind ran from its checked Message
                kinds = {"allgather", "allreduce", "broadcast", "reducescatter"}
                assert kinds <= set(said["global-checked-kinds"]), said


def test_a_joined_rank_answers_plain_calls_small_and_large(tmp_path):
    size = 3
    _, reports, got = run(size, "join", tmp_path)
    for rank in range(size):
        assert reports[rank]["last"] == size - 1
        assert reports[rank]["after"] == [size, size]
        for step in range(2 + rank):
            present = sum(1 for r in range(size) if step < 2 + r)  # the ranks that still had this step
            np.testing.assert_array_equal(got[rank][f"small-{step}"], np.full(4, (step + 1.0) * present))
            # Average divides by every rank of the job, joined ones included (as Horovod).
            np.testing.assert_array_equal(got[rank][f"large-{step}"], np.full(50_000, (step + 1.0) * present / size))


def test_a_plain_call_right_after_join_pairs_with_the_others_plain_call(tmp_path):
    """A rank that sees the join end first may call again before the others have stopped
    answering as joined ranks: that call is not answered with the identity."""
    size = 3
    _, reports, _ = run(size, "rejoin", tmp_path, arrays=False)
    for rank in range(size):
        assert reports[rank]["after"] == [size] * 300, rank


def test_a_rank_waiting_in_a_plain_call_is_judged_by_what_it_waits_for(tmp_path):
    """Rank 1's async allgather is a deadlock (rank 0 will never submit it): rank 1 gets the error;
    rank 0's plain call is no deadlock, it waits for rank 1's plain call, which then comes."""
    _, reports, _ = run(2, "elsewhere", tmp_path, env={"RINGREDUCE_DEADLOCK_TIME": "1"}, arrays=False)
    assert reports[1]["error"].startswith("DeadlockError: deadlock: every rank has been blocked for 1 s")
    assert "rank 0 waits elsewhere" in reports[1]["error"]
    site = site_in("core/plain_calls.py", 'name="only-on-1"')
    assert f"rank 1 waits in allgather 'only-on-1' ({site})" in reports[1]["error"]
    assert reports[0] == {"plain": [3.0, 3.0]}
    assert reports[1]["plain"] == [3.0, 3.0]


def test_a_peer_that_shuts_down_ends_a_plain_call_with_peer_exited(tmp_path):
    _, reports, _ = run(2, "left", tmp_path, arrays=False)
    assert reports[0] == {"error": "PeerExitedError: rank 1 shut down while rank 0 waited in plain allreduce "
                                   "'lonely'; every rank must make the same plain calls in the same order"}


def test_a_stalled_plain_call_warns_then_fails_and_the_rank_stays_out_of_step(tmp_path):
    """Stalled, rank 0 gives up: its later plain calls fail at once, and never pair up wrongly."""
    job, reports, _ = run(2, "stall", tmp_path, env={"RINGREDUCE_STALL_CHECK_TIME": "0.5",
                                                     "RINGREDUCE_STALL_SHUTDOWN_TIME": "1"}, arrays=False)
    stall = re.compile(r"ringreduce stall: plain allreduce 'late' \(call 1 in program order\) has waited \d s for "
                       "rank 1; plain calls pair up in program order")
    assert reports[0]["late"].startswith("StallError: ") and stall.search(reports[0]["late"]), reports[0]
    assert any(stall.search(line) for line in job.lines_of(0, "stderr")), job.stderr
    assert reports[0]["next"].startswith("RingReduceError: plain calls no longer pair up in program order on "
                                         "rank 0: an earlier one failed here (StallError: ")
    # Rank 1's late call meets the call rank 0 gave up on, whose data had been sent: the right sum.
    assert reports[1]["late"] == [3.0, 3.0]
    # Its next one waits for rank 0, which has given up and left by then.
    assert reports[1]["next"] == ("PeerExitedError: rank 0 shut down while rank 1 waited in plain allreduce 'next'; "
                                  "every rank must make the same plain calls in the same order")


def test_a_description_longer_than_the_room_for_it_is_a_mismatch_and_the_job_goes_on(tmp_path):
    _, reports, _ = run(3, "long", tmp_path, arrays=False)
    for rank in (0, 2):
        assert reports[rank]["error"].startswith("MismatchError: allreduce 'x' does not match across ranks: another "
                                                 "rank's call is larger than this one's beyond the room for it")
    assert reports[1]["error"].startswith("MismatchError: plain calls pair up in program order, and here their names "
                                          "differ")
    assert all(report["after"] == [3.0, 3.0] for report in reports)

