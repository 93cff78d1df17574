"""How ringreduce waits for MPI requests, as pure logic: a fake clock and fake requests stand in
for MPI's progress, so the test says what the wait does, not how fast a machine runs it."""

import types

import numpy as np
import pytest

from ringreduce.collectives import GroupHandle
from ringreduce.engine.requests import Handle
from ringreduce.machine import transport


class _Progress:
    """MPI.Request.Testsome over fake requests: each call takes `step` seconds of the fake clock
    and completes the first pending request once it has been polled `polls_each` times."""

    def __init__(self, clock, step, polls_each):
        self.clock, self.step, self.polls_each, self.polls = clock, step, polls_each, 0

    def Testsome(self, pending):
        self.clock.now += self.step
        self.polls += 1
        if not pending:
            return None
        if self.polls % self.polls_each == 0:
            return [0]
        return []


class _Clock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def perf_counter(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def fake_mpi(monkeypatch):
    clock = _Clock()

    def install(step, polls_each):
        progress = _Progress(clock, step, polls_each)
        monkeypatch.setattr(transport, "MPI", types.SimpleNamespace(Request=progress))
        monkeypatch.setattr(transport, "time", types.SimpleNamespace(perf_counter=clock.perf_counter,
                                                                     sleep=clock.sleep))
        monkeypatch.setattr(transport.os, "sched_yield", lambda: None)
        monkeypatch.setattr(transport.faults, "check", lambda: None)
        return progress

    return clock, install


def test_a_transfer_in_pieces_is_polled_afresh_after_each_piece(fake_mpi):
    """64 pieces, each done after 3 polls of 100 us: past the first 200 us a single wait would
    sleep between pieces; restarted at each piece, it never sleeps."""
    clock, install = fake_mpi
    progress = install(step=100e-6, polls_each=3)
    transport.wait_all([object() for _ in range(64)])
    assert progress.polls == 64 * 3 and clock.slept == []


def test_a_request_that_stays_pending_is_waited_for_asleep(fake_mpi):
    """Nothing completes for 50 ms: after polling for YIELD_SECONDS the wait sleeps, a quarter of
    the time waited so far and at most MAX_SLEEP_SECONDS at a time."""
    clock, install = fake_mpi
    install(step=10e-6, polls_each=5000)
    transport.wait_all([object()])
    assert clock.slept and max(clock.slept) == transport.MAX_SLEEP_SECONDS
    assert clock.slept[0] == pytest.approx((transport.YIELD_SECONDS + 10e-6) / 4, rel=0.1)
    assert sum(clock.slept) < clock.now


def test_nothing_to_wait_for_returns_at_once(fake_mpi):
    _, install = fake_mpi
    progress = install(step=1.0, polls_each=1)
    transport.wait_all([])
    assert progress.polls == 0


def test_the_mpi_librarys_own_collectives_are_polled_through_their_steps(fake_mpi):
    """A collective whose steps take 1.5 ms of polling: waited as one, it is never left asleep;
    waited as a message, it would be (a rank asleep holds up every step of MPI's schedule)."""
    clock, install = fake_mpi
    install(step=10e-6, polls_each=150)
    transport.wait_all([object()], transport.COLLECTIVE_YIELD_SECONDS)
    assert clock.slept == []
    transport.wait_all([object()])
    assert clock.slept


def test_every_collective_of_mpis_own_family_waits_as_a_collective(monkeypatch):
    from ringreduce.algorithms import mpi_native

    waited = []
    monkeypatch.setattr(mpi_native, "wait_all", lambda requests, yield_seconds: waited.append(yield_seconds))
    comm = types.SimpleNamespace(rank=0, **{name: lambda *args: object() for name in (
        "Iallreduce", "Ireduce_scatter", "Iallgatherv", "Ibcast", "Ialltoallv")})
    family = mpi_native.MPIAlgorithms(types.SimpleNamespace(comm=comm))
    buf = np.zeros(4, np.float32)
    family.allreduce(buf, mpi_native.ReduceOp.SUM)
    family.reducescatter(buf, [0, 4], mpi_native.ReduceOp.SUM)
    family.allgather(buf, [0, 4])
    family.broadcast(buf, 0)
    family.alltoallv(buf, [0, 4], buf.copy(), [0, 4])
    assert waited == [transport.COLLECTIVE_YIELD_SECONDS] * 5

    class Persistent:  # the small allreduces' persistent ones: set up with the collective's wait
        persistent = True

        def __init__(self, comm, sendbuf, recvbuf, op, yield_seconds=transport.YIELD_SECONDS):
            waited.append(yield_seconds)

        def __call__(self):
            pass

    monkeypatch.setattr(mpi_native, "PersistentAllreduce", Persistent)
    mpi_native.MPIAlgorithms(types.SimpleNamespace(comm=comm), persistent_below=1 << 20).allreduce(
        buf, mpi_native.ReduceOp.SUM)
    assert waited[5:] == [transport.COLLECTIVE_YIELD_SECONDS]


def test_a_grouped_wait_that_times_out_names_the_member_and_the_whole_timeout():
    """The member waited for last gets what is left of the timeout; the error still says the
    timeout the caller gave (torch's process group quotes it), not that remainder."""
    done, pending = Handle("grad.0"), Handle("grad.1")
    done.finish(np.ones(2))
    with pytest.raises(TimeoutError, match=r"^grad\.1 did not finish within 0\.05 s$"):
        GroupHandle([done, pending]).wait(0.05)
    pending.finish(np.zeros(2))
    first, second = GroupHandle([done, pending]).wait(0.05)
    assert first.tolist() == [1.0, 1.0] and second.tolist() == [0.0, 0.0]
