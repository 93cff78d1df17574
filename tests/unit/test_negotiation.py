"""The negotiation and fusion planning as pure logic: several ranks' rows in, decisions out."""

import pytest

from ringreduce.engine import fusion
from ringreduce.engine.agreement import Message
from ringreduce.engine.negotiation import Negotiator
from ringreduce.engine.wire import DEADLOCKED, GPU_TAKEN, JOINED, SHUTTING_DOWN, STALLED, RankState
from ringreduce.errors import DeadlockError, MismatchError, PeerExitedError, RingReduceError, StallError


def msg(name, shape=(4,), dtype="float32", kind="allreduce", op=0, compression="none", device="cpu"):
    return Message(name=name, kind=kind, dtype=dtype, shape=shape, op=op, compression=compression, device=device)


def idle(size, flags=0):
    return [RankState(flags, ()) for _ in range(size)]


def names(outcome):
    return [r.name for r in outcome.responses]


def test_a_name_is_ready_once_every_rank_has_submitted_it_in_first_seen_order():
    n = Negotiator(2, cache_capacity=8)
    assert names(n.negotiate(idle(2), [[msg("a"), msg("b")], [msg("b")]], now=0.0)) == ["b"]
    assert names(n.negotiate(idle(2), [[], [msg("a")]], now=1.0)) == ["a"]


def test_every_rank_reaches_the_same_decisions_whatever_order_each_enqueued_in():
    """Each rank holds its own Negotiator; fed the same gathered rows, they must agree exactly."""
    copies = [Negotiator(2, cache_capacity=4) for _ in range(2)]
    cycles = [
        [[msg("c"), msg("a")], [msg("b")]],  # each rank enqueued in its own order
        [[msg("b")], [msg("a"), msg("c")]],
        [[msg("d")], [msg("d")]],
    ]
    decided = [[names(n.negotiate(idle(2), announced, now=float(t))) for t, announced in enumerate(cycles)]
               for n in copies]
    assert decided[0] == decided[1] == [[], ["c", "a", "b"], ["d"]]
    assert [copies[0].cache.slot_for(msg(x), 0) for x in "abcd"] == \
           [copies[1].cache.slot_for(msg(x), 0) for x in "abcd"]


def test_repeats_need_only_cache_bits():
    n = Negotiator(2, cache_capacity=8)
    n.negotiate(idle(2), [[msg("g")], [msg("g")]], now=0.0)
    slot = n.cache.slot_for(msg("g"), 0)
    assert slot is not None and n.cache.slot_for(msg("g"), 1) == slot
    half = n.negotiate([RankState(0, (slot,)), RankState(0, ())], [[], []], now=1.0)
    assert half.responses == []
    done = n.negotiate([RankState(0, (slot,)), RankState(0, (slot,))], [[], []], now=2.0)
    assert names(done) == ["g"] and n.cache_hits == 1


def test_a_gpu_collective_waits_for_a_cycle_in_which_no_rank_s_gpu_is_taken():
    """Where another process set's cycle holds a rank's GPU, that cycle agrees no collective on the
    GPU (host ones go on), announced or cached; the next cycle without a taken GPU agrees them."""
    n = Negotiator(2, cache_capacity=8)
    taken = [RankState(0, ()), RankState(GPU_TAKEN, ())]
    gpu, host = msg("gpu", device="cuda"), msg("host")
    assert names(n.negotiate(taken, [[gpu, host], [gpu, host]], now=0.0)) == ["host"]
    assert names(n.negotiate(idle(2), [[], []], now=1.0)) == ["gpu"]
    slot = n.cache.slot_for(gpu, 0)
    assert names(n.negotiate([RankState(GPU_TAKEN, (slot,)), RankState(0, (slot,))], [[], []], now=2.0)) == []
    assert names(n.negotiate([RankState(0, (slot,)), RankState(0, (slot,))], [[], []], now=3.0)) == ["gpu"]
    mismatched = [msg("mixed", device="cuda"), msg("mixed")]  # an error is agreed whoever holds a GPU
    outcome = n.negotiate(taken, [[mismatched[0]], [mismatched[1]]], now=4.0)
    assert names(outcome) == ["mixed"] and isinstance(outcome.responses[0].error, MismatchError)


def test_changed_arguments_leave_the_cache_and_are_compared_again():
    n = Negotiator(2, cache_capacity=8)
    n.negotiate(idle(2), [[msg("g")], [msg("g")]], now=0.0)
    slot = n.cache.slot_for(msg("g"), 0)
    assert n.cache.slot_for(msg("g", shape=(5,)), 0) is None
    outcome = n.negotiate([RankState(0, ()), RankState(0, (slot,))], [[msg("g", shape=(5,))], []], now=1.0)
    (response,) = outcome.responses
    assert isinstance(response.error, MismatchError)
    assert "shape (5,) on rank 0 but (4,) on rank 1" in str(response.error)
    assert "g" not in n.cache


def test_the_least_recently_used_name_leaves_a_full_cache():
    n = Negotiator(1, cache_capacity=2)
    for name in ("a", "b"):
        n.negotiate(idle(1), [[msg(name)]], now=0.0)
    n.negotiate([RankState(0, (n.cache.slot_for(msg("a"), 0),))], [[]], now=1.0)  # touch a
    n.negotiate(idle(1), [[msg("c")]], now=2.0)
    assert "a" in n.cache and "c" in n.cache and "b" not in n.cache


def test_joined_ranks_stand_in_for_allreduce_only():
    n = Negotiator(3, cache_capacity=8)
    states = [RankState(0, ()), RankState(JOINED, ()), RankState(0, ())]
    outcome = n.negotiate(states, [[msg("a"), msg("b", kind="broadcast")], [], [msg("a"), msg("b", kind="broadcast")]],
                          now=0.0)
    by_name = {r.name: r for r in outcome.responses}
    assert by_name["a"].error is None and by_name["a"].messages[1] is None
    assert isinstance(by_name["b"].error, RingReduceError) and "rank 1 called join()" in str(by_name["b"].error)
    assert "a" not in n.cache  # a stand-in's absence is not something to remember


def test_join_done_names_the_last_rank_to_join():
    n = Negotiator(3, cache_capacity=0)
    n.negotiate([RankState(JOINED, ()), RankState(0, ()), RankState(0, ())], [[], [], []], now=0.0)
    n.negotiate([RankState(JOINED, ()), RankState(0, ()), RankState(JOINED, ())], [[], [], []], now=1.0)
    assert n.negotiate(idle(3, JOINED), [[], [], []], now=2.0).join_done == 1


def test_requests_involving_a_rank_that_shuts_down_fail():
    n = Negotiator(2, cache_capacity=8)
    outcome = n.negotiate([RankState(0, ()), RankState(SHUTTING_DOWN, ())], [[msg("x")], []], now=0.0)
    (response,) = outcome.responses
    assert isinstance(response.error, PeerExitedError)
    assert str(response.error).startswith("rank 1 shut down while rank 0 waited in allreduce 'x'")
    assert not outcome.all_shut_down
    assert n.negotiate(idle(2, SHUTTING_DOWN), [[], []], now=1.0).all_shut_down


def test_stalls_warn_once_then_fail_together_once_a_rank_flags_them():
    n = Negotiator(3, cache_capacity=8, stall_check_seconds=10, stall_shutdown_seconds=30)
    n.negotiate(idle(3), [[msg("w")], [], [msg("w")]], now=0.0)
    assert n.negotiate(idle(3), [[], [], []], now=5.0).stall_warning is None
    warned = n.negotiate(idle(3), [[], [], []], now=11.0)
    assert "allreduce 'w': submitted by ranks 0, 2 11 s ago, still missing from rank 1" in warned.stall_warning
    assert n.negotiate(idle(3), [[], [], []], now=12.0).stall_warning is None
    assert not n.stall_due(29.0) and n.stall_due(31.0)
    # Nothing fails on one rank's clock alone: only when a row carries the flag, and then
    # everything waiting from before this cycle fails (a name first seen now does not).
    assert n.negotiate(idle(3), [[], [], []], now=31.0).responses == []
    flagged = [RankState(STALLED, ()), RankState(0, ()), RankState(0, ())]
    fatal = n.negotiate(flagged, [[msg("fresh")], [], []], now=32.0)
    (response,) = fatal.responses
    assert response.name == "w" and isinstance(response.error, StallError)
    assert "missing from rank 1" in str(response.error)
    assert list(n.table) == ["fresh"]


def test_stragglers_are_the_ranks_that_waited_least():
    n = Negotiator(3, cache_capacity=8)
    for step in range(4):
        waits = (0.0, 0.0, 0.0) if step == 0 else (0.030, 0.0001, 0.020)
        n.negotiate([RankState(0, (), w) for w in waits], [[msg(f"s{step}")]] * 3, now=float(step))
    # Three cycles ran after one that made something ready: rank 1 arrived last in each,
    # keeping the others waiting 29.9 ms at most.
    ((rank, share, late),) = n.stragglers.report()
    assert (rank, share) == (1, 1.0) and late == pytest.approx(0.0299)
    assert n.stragglers.cycles == 3


@pytest.mark.parametrize("threshold, sizes", [(1000, [[0, 1], [2]]), (0, [[0], [1], [2]]), (10**9, [[0, 1, 2]])])
def test_fusion_plan_respects_the_threshold(threshold, sizes):
    responses = [type("R", (), {"name": f"t{i}", "error": None, "message": msg(f"t{i}", shape=(100,))})()
                 for i in range(3)]
    groups = fusion.plan(responses, threshold)
    assert [[int(r.name[1:]) for r in g] for g in groups] == sizes


def test_fusion_keeps_different_dtypes_ops_and_compression_apart():
    specs = [msg("a"), msg("b", dtype="float64"), msg("c", op=1), msg("d", compression="fp16"), msg("e"),
             msg("f", kind="broadcast"), msg("g", device="cuda"), msg("h", device="cuda")]
    responses = [type("R", (), {"name": m.name, "error": None, "message": m})() for m in specs]
    groups = fusion.plan(responses, 10**9)
    assert sorted(sorted(r.name for r in g) for g in groups) == [["a", "e"], ["b"], ["c"], ["d"], ["f"], ["g", "h"]]
    assert fusion.wire_bytes(msg("d", compression="fp16", shape=(10,))) == 20


def test_a_deadlock_is_decided_only_when_every_rank_says_so_and_nothing_arrived():
    n = Negotiator(2, cache_capacity=8, deadlock_seconds=5.0)
    n.negotiate(idle(2), [[msg("a")], [msg("b")]], now=0.0)
    assert not n.deadlock_suspected(4.9) and n.deadlock_suspected(5.0)
    one_says = [RankState(DEADLOCKED, ()), RankState(0, ())]
    assert names(n.negotiate(one_says, [[], []], now=6.0)) == []
    arriving = n.negotiate(idle(2, DEADLOCKED), [[], [msg("c")]], now=7.0)  # rank 1 submitted something new
    assert names(arriving) == [] and not n.deadlock_suspected(11.0)
    outcome = n.negotiate(idle(2, DEADLOCKED), [[], []], now=12.0)
    assert names(outcome) == ["a", "b", "c"]
    assert all(isinstance(r.error, DeadlockError) for r in outcome.responses)
    waits = "rank 0 waits in allreduce 'a'; rank 1 waits in allreduce 'b', allreduce 'c'"
    assert waits in str(outcome.responses[0].error)
    assert n.table == {} and not n.deadlock_suspected(20.0)


def test_no_deadlock_check_when_its_time_is_zero():
    n = Negotiator(2, cache_capacity=8)
    n.negotiate(idle(2), [[msg("a")], [msg("b")]], now=0.0)
    assert not n.deadlock_suspected(1e6)
