"""Plain collectives in program order: one message to each peer that carries the call's
description and, when it is small, its data.

Why: a tensor-parallel forward pass calls small allreduces many times per step, and waits for
each. Through the engine such a call costs the negotiation's collective, the data's collective
and the Python around both; MPI's own allreduce costs one collective. A plain call blocks its
thread, so a rank's plain allreduces on one process set come in program order, the same on every
rank of a correct program (as MPI requires of collectives on a communicator). That order pairs
the calls up without a negotiation: each rank sends every peer its call's Message (what the
engine would compare) with its prescaled data, receives theirs, and then
- if the messages differ, every rank has seen all of them and raises the same error;
- if they agree and the data came along, finishes the call there: an allreduce combines the
  contributions in rank order, so that every rank gets the same result bit for bit; an allgather
  puts each rank's rows in rank order (each rank sends its rows when they are small, and says so:
  the ranks' first dimensions may differ, and every rank sees whether all of them came); a
  reducescatter combines its own rows of the contributions as the allreduce does; a broadcast
  takes the root's;
- if they agree on a larger one of these of host arrays, uncompressed, the caller's thread runs
  it with the engine's caller algorithms, on communicators and shared memory of their own: every
  rank is at this call, so nothing is left to negotiate, and the engine's cycles (its state
  exchange, the hand-over to its thread and back) would only add to the algorithm's time;
- otherwise (on a GPU, compressed, another kind, a rank that has joined) the caller runs it
  through the engine as before: the exchange only checked it.

Each distinct call gets a plan the first time it comes: its packet in a buffer of its own, a
buffer per peer (which all plans share), and MPI persistent requests that send and receive them,
so that a repeated call costs one copy in, starting the requests and testing them, and the
reduction.

Plain calls pair with plain calls: an async allreduce of the same name on another rank does not
pair with a plain one. Two threads making plain allreduces on one set at once have no order in
common across ranks: give them the async forms (or RINGREDUCE_PROGRAM_ORDER=0). A rank that has
joined answers the plain calls of the others with the op's identity until every rank has joined.
"""

import math
import os
import pickle
import struct
import time
import typing

import numpy as np
from mpi4py import MPI

from ringreduce import ops
from ringreduce.engine import agreement
from ringreduce.engine.loop import report_stall
from ringreduce.engine.negotiation import Response, Stragglers
from ringreduce.engine.requests import Request
from ringreduce.errors import MismatchError, PeerExitedError, RankFailedError, RingReduceError, StallError, ranks_text
from ringreduce.machine import faults
from ringreduce.machine.layout import even_counts
from ringreduce.machine.transport import MAX_SLEEP_SECONDS, YIELD_SECONDS, wait_until
from ringreduce.numerics import reduction

MAX_RANKS = 8  # above this, sending every peer a message costs more than the engine's collectives
DATA_BYTES = 64 << 10  # the most data a rank sends its peers together for one call
_TAG = 1
_JOINED = 1  # flags: the sender has joined and stands in with the op's identity
_ENDED = 2  # flags: the join has ended for the sender; what it sends next is a call after the join
_DATA = 4  # flags: the sender's data follows its description
# flags, length of the pickled Message, rows of an allgather's data, call number, seconds waited for
# the others in the call before
_PREFIX = struct.Struct("<BxxxIIQd")
_REDUCING_KINDS = ("allreduce", "reducescatter")
_CARRIED_KINDS = (*_REDUCING_KINDS, "allgather", "broadcast")
_ALIGN = 8
_ROOM = 4096  # how much longer than this rank's a peer's description may be and still arrive whole
# Distinct calls kept: a tensor-parallel step has a handful, a loop of one plain call per
# parameter one per tensor (161 for ResNet-50); rebuilding a plan each call doubled such a step.
_PLANS = 512


def available(comm, config):
    """Can this communicator's plain allreduces run in program order? Decided together (a
    collective call): every rank must take the same path."""
    mine = config.program_order and MPI.Query_thread() == MPI.THREAD_MULTIPLE and comm.size <= MAX_RANKS
    return bool(comm.allreduce(int(mine), op=MPI.MIN))


class PlainCalls:
    """The plain calls of one domain on this rank, over a communicator of their own."""

    def __init__(self, comm, ranks, engine, where):
        """`comm` is owned from now on; `ranks` are its ranks as the user knows them, `engine` the
        domain's (whose view of the other ranks tells a peer that left), `where` names the set."""
        self.comm, self.ranks, self.engine, self.where = comm, list(ranks), engine, where
        self.me, self.size = comm.rank, comm.size
        self.peers = [r for r in range(self.size) if r != self.me]
        self.calls = 0  # plain calls so far: the same count on every rank in step
        self.ran = 0  # of which ran here (the others through the engine)
        self.bytes = 0  # of the arrays those carried
        self.waiting = None  # (name, ranks not heard from) of a call that has waited a while
        self._plans = {}  # Message -> _Plan
        self._inbox = {}  # peer -> the buffer its packets arrive in, for every plan that fits it
        self._scratch = bytearray(_ALIGN)  # packets taken outside a plan: answered as joined, or stranded
        self._status = MPI.Status()
        self._broken = None
        self._waited = 0.0  # in the last call, for the others' packets
        self.stragglers = Stragglers(self.size)  # who came last to the plain calls, as the engine's cycles

    def run(self, message, array, output):
        """Meet the other ranks' call of this place in program order: `message` is this rank's
        (checked), `array` its input and `output` where an allreduce's result goes (None: a new
        array). Returns (True, result) when that ran the call, (False, None) when the engine must
        (the ranks agree, but this rank cannot finish the call itself)."""
        if self.engine.failure is not None:  # the ranks are out of step: every later call fails with it
            raise self.engine.failure
        if self._broken is not None:
            raise RingReduceError(f"plain calls{self.where} no longer pair up in program order on rank "
                                  f"{self.ranks[self.me]}: an earlier one failed here ({self._broken})")
        recording = self.engine.timeline.recording
        started = time.perf_counter() if recording else None
        plan = self._plan(message)
        sent_wait = self._waited
        _PREFIX.pack_into(plan.out, 0, _DATA if plan.sends else 0, len(plan.header), plan.rows, self.calls, sent_wait)
        source = array if array is not None else output  # a broadcast's root in place has only its output
        if message.kind in _REDUCING_KINDS and plan.sends:
            reduction.scale(array, message.prescale, out=plan.mine)
        elif plan.sends:
            np.copyto(plan.mine, source)
        MPI.Prequest.Startall(plan.requests)
        try:
            received = self._receive(message, plan)
        except MismatchError:
            self.calls += 1  # every rank took this call's packets: still in step
            raise
        except BaseException as error:
            self._broken = f"{type(error).__name__}: {error}"
            raise
        number, self.calls = self.calls, self.calls + 1
        joined = {packet.peer for packet in received if packet.flags & _JOINED}
        alike = self._check(message, plan.header, received, number)
        if number and not joined:
            self._record_waits(received, sent_wait)
        if plan.carries and message.kind == "allreduce":
            result = self._combine(message, plan, received, joined, alike, output)
        elif joined:
            return False, None  # the engine stands the joined ranks in, or refuses the call
        elif plan.carries and message.kind == "reducescatter":
            rows = even_counts(message.shape[0], self.size)  # as the engine divides them
            start = sum(rows[:self.me])
            result = self._combine(message, plan, received, joined, alike, None,
                                   slice(start, start + rows[self.me]))
        elif plan.carries and message.kind == "broadcast":
            result = output
            if not (plan.sends and array is None):  # but the root's own array, in place
                np.copyto(result, self._data_of(message.root, plan, received))
        elif plan.carries and message.kind == "allgather" and all(packet.flags & _DATA for packet in received):
            result = np.concatenate([self._data_of(rank, plan, received) for rank in range(self.size)])
        elif message.kind == "barrier":
            result = None  # every rank has arrived
        elif plan.direct and self.engine.caller_executor is not None:
            result, recording = self._execute(message, plan, received, array, output), False  # its own phases
        else:
            return False, None
        self.ran += 1
        if source is not None:
            self.bytes += source.nbytes
        if recording:
            self.engine.timeline.phase(message.name, message.kind.upper(), started, time.perf_counter(), flush=True)
        return True, result

    def _plan(self, message):
        plan = self._plans.get(message)
        if plan is None:
            if len(self._plans) >= _PLANS:  # a program that makes ever new calls: keep what recent ones need
                self._free_plans()
            plan = self._plans[message] = _Plan(message, self.comm, self.me, self.peers, self._inbox)
            self._inbox = plan.ins  # a larger one, where this description needed more room
        return plan

    def _receive(self, message, plan):
        """Every peer's _Packet once the plan's requests are done, waiting as transport.wait_until
        does, and telling a peer that left or a stall from a wait that goes on."""
        started = time.perf_counter()
        warned = told_async = False
        while not _done(plan.requests, message, self.where):
            waited = time.perf_counter() - started
            if waited < YIELD_SECONDS:
                os.sched_yield()
                continue
            faults.check()
            with self.engine.waiters:  # this rank is blocked: what tells a deadlock of the others' requests
                time.sleep(min(waited / 4, MAX_SLEEP_SECONDS))
            pending = {peer: request for peer, request in zip(self.peers, plan.receives, strict=True)
                       if not _done([request], message, self.where)}
            waiting = list(pending)
            self.waiting = (message.name, [self.ranks[peer] for peer in waiting])
            self._check_others(message, pending, waited)
            if not told_async:
                told_async = self._tell_async(message, waiting)
            if not warned and waited >= self.engine.config.stall_check_seconds:
                warned = True
                report_stall(self.ranks[self.me], self._stall_text(message, waiting, waited),
                             self.engine.config.stall_stacks)
        self._waited = time.perf_counter() - started
        self.waiting = None
        return [_Packet(peer, *_PREFIX.unpack_from(buffer), buffer) for peer, buffer in plan.ins.items()]

    def _take(self, incoming):
        """A packet taken outside a plan (a matched probe's), in the scratch buffer."""
        count = self._status.Get_count(MPI.BYTE)
        if len(self._scratch) < count:
            self._scratch = bytearray(count)
        incoming.Recv([self._scratch, count, MPI.BYTE])
        return _Packet(self._status.Get_source(), *_PREFIX.unpack_from(self._scratch), self._scratch)

    def _check_others(self, message, pending, waited):
        """Raise when waiting on cannot end well (`pending`: the receive of each peer not yet heard
        from): a peer left, the engine broke, or RINGREDUCE_STALL_SHUTDOWN_TIME has passed."""
        if self.engine.failure is not None:
            raise self.engine.failure
        waiting = list(pending)
        # A peer sends its packet before it can leave; it may come in just after the engine saw it go
        # (into the receive posted for it, which a probe would not see: test the receive again).
        left = [peer for peer in waiting
                if peer in self.engine.leaving and not _done([pending[peer]], message, self.where)]
        if left:
            raise PeerExitedError(
                f"{self._text(left)} shut down while rank {self.ranks[self.me]} waited in plain {message.kind} "
                f"{message.name!r}{self.where}; every rank must make the same plain calls in the same order")
        shutdown_after = self.engine.config.stall_shutdown_seconds
        if shutdown_after is not None and waited >= shutdown_after:
            raise StallError(self._stall_text(message, waiting, waited)
                             + f" (RINGREDUCE_STALL_SHUTDOWN_TIME={shutdown_after:g})")

    def _tell_async(self, message, waiting):
        """Say so at once when peers this call waits for have submitted its name to the engine (an
        async call): it will not pair with this plain one. True once said."""
        entry = self.engine.negotiator.table.get(message.name)
        async_peers = [peer for peer in waiting if entry is not None and peer in entry.messages]
        if async_peers:
            report_stall(self.ranks[self.me], f"ringreduce: plain {message.kind} {message.name!r}{self.where} waits "
                         f"for {self._text(async_peers)}, which submitted {message.name!r} as an async call; a plain "
                         "call pairs only with the other ranks' plain calls: use the same form on every rank", False)
        return bool(async_peers)

    def _stall_text(self, message, waiting, waited):
        return (f"ringreduce stall: plain {message.kind} {message.name!r}{self.where} (call {self.calls + 1} in "
                f"program order) has waited {waited:.0f} s for {self._text(waiting)}; plain calls pair up "
                "in program order, so every rank must make the same plain calls in the same order")

    def _check(self, message, header, received, number):
        """Raise the same error on every rank where the ranks' calls (this rank's `number`th) differ.
        True when every description but a joined rank's is this rank's byte for byte (none differs
        but in its call site): then each peer's data lies where the plan expects it."""
        headers, differ = {}, False
        for packet in received:
            if packet.flags & _JOINED:
                continue
            theirs = headers[self.ranks[packet.peer]] = packet.buffer[_PREFIX.size:_PREFIX.size + packet.length]
            if packet.calls != number:
                raise MismatchError(
                    f"plain calls{self.where} are out of step: this is call {number + 1} in program order on "
                    f"rank {self.ranks[self.me]}, {message.described()}, but call {packet.calls + 1} on rank "
                    f"{self.ranks[packet.peer]}, {pickle.loads(theirs).described()} (a call that failed on one "
                    "rank only, or plain calls made from two threads at once)")
            differ = differ or theirs != header
        if not differ:
            return True
        messages = {self.ranks[self.me]: message, **{rank: pickle.loads(h) for rank, h in headers.items()}}
        ranks = sorted(messages)
        error = agreement.disagreement([messages[r] for r in ranks], ranks, self.where)
        if error is None:
            names = {}
            for rank in ranks:
                names.setdefault(messages[rank].name, []).append(rank)
            if len(names) > 1:
                error = MismatchError(f"plain calls{self.where} pair up in program order, and here their names "
                                      "differ: " + " but ".join(f"{messages[who[0]].kind} {name!r} on "
                                                                 f"{ranks_text(who)}" for name, who in names.items())
                                      + agreement.called_at([messages[r] for r in ranks], ranks))
        if error is not None:
            raise error
        return False

    def _record_waits(self, received, sent_wait):
        """Each packet says how long its sender waited in the call before: every rank records the
        same waits, and so names the same straggler (one call late)."""
        waits = [sent_wait] * self.size
        for packet in received:
            waits[packet.peer] = packet.waited
        self.stragglers.record(waits)

    def _execute(self, message, plan, received, array, output):
        """Run the call as the engine's executor would, on this thread (see the module's text)."""
        messages = [message] * self.size
        if plan.ragged:  # each rank's own rows
            for packet in received:
                if packet.rows != plan.rows:
                    messages[packet.peer] = message._replace(shape=(packet.rows, *message.shape[1:]))
        request = Request(message, None, input=array, output=output)
        try:
            return self.engine.caller_executor.run([Response(message.name, tuple(messages))], [request])[0]
        except BaseException as error:  # cut short, the ranks' algorithms are out of step: no later call here
            self._broken = f"{type(error).__name__}: {error}"
            raise

    def _data_of(self, rank, plan, received):
        """Rank `rank`'s data in this call (received in peer order: the ranks but this one)."""
        return plan.mine if rank == self.me else plan.data(received[rank - (rank > self.me)])

    def _combine(self, message, plan, received, joined, alike, output, rows=None):
        """The contributions (their `rows`, or all of them) combined in rank order (the same rounding
        on every rank), scaled; into `output`, or a new array. A `joined` rank adds the identity:
        nothing. `alike`: every peer's description is this rank's (_check), so its data lies where the
        plan expects it."""
        if alike and not joined:
            parts = plan.in_rank_order
        else:
            parts = [self._data_of(rank, plan, received) for rank in range(self.size) if rank not in joined]
        if rows is not None:
            parts = [part[rows] for part in parts]
        if len(parts) == 1:
            result = parts[0].copy() if output is None else output
            if output is not None:
                np.copyto(output, parts[0])
        else:
            result = plan.combine(parts[0], parts[1], out=output)
            if output is None and not plan.shape:  # 0-d arrays combine into a scalar
                result = np.asarray(result)
            for part in parts[2:]:
                plan.combine(result, part, out=result)
        if message.op == ops.Average or message.postscale != 1.0:
            reduction.scale_result(result, message.op, self.size, message.postscale)
        return result

    def answer_as_joined(self, join):
        """While the `join` handle is pending, answer every plain allreduce of the others as a joined
        rank (with the op's identity), adopting the highest call count among them, so that this rank
        is in step once all have joined. Ranks see the join end at different moments, and one that
        has seen it may make its next plain call at once: so each rank tells every peer that its
        join has ended, in a packet that comes before any later call of its own (MPI keeps a pair's
        messages in order), and answers a peer's packets only until that peer's end has come."""
        answer, end = bytearray(_PREFIX.size), bytearray(_PREFIX.size)
        _PREFIX.pack_into(answer, 0, _JOINED, 0, 0, 0, 0.0)
        unheard = set(self.peers)  # peers whose end of the join has not come
        told = False
        found = []

        def arrived():
            nonlocal told
            if not told and join.done():
                if not join.succeeded():
                    return True  # its error is the caller's to raise
                _PREFIX.pack_into(end, 0, _ENDED, 0, 0, self.calls, 0.0)
                for peer in self.peers:
                    self.comm.Send(end, peer, _TAG)
                told = True
            found.clear()
            for peer in unheard:  # not ANY_SOURCE: a peer's packets after its end are not the join's
                incoming = self.comm.Improbe(peer, _TAG, self._status)
                if incoming is not None:
                    found.append(incoming)
                    return True
            return told and not unheard

        with self.engine.waiters:
            while True:
                wait_until(arrived)
                if not found:
                    return
                packet = self._take(found[0])
                if packet.flags & _ENDED:
                    unheard.discard(packet.peer)
                    continue
                self.calls = max(self.calls, packet.calls + 1)  # peers' packets come in any order
                self.comm.Send(answer, packet.peer, _TAG)

    def stranded(self):
        """While this rank shuts down (on the engine's thread): what a peer's plain call waits for
        from it, as the peer's PeerExitedError will say, or None."""
        incoming = self.comm.Improbe(MPI.ANY_SOURCE, _TAG, self._status)
        if incoming is None:
            return None
        packet = self._take(incoming)
        if packet.flags & (_JOINED | _ENDED):
            return None
        message = pickle.loads(packet.buffer[_PREFIX.size:_PREFIX.size + packet.length])
        return (f"rank {self.ranks[self.me]} shut down while rank {self.ranks[packet.peer]} waited in plain "
                f"{message.kind} {message.name!r}{self.where}; every rank must make the same collective calls")

    def _text(self, peers):
        return ranks_text(sorted(self.ranks[p] for p in peers))

    def _free_plans(self):
        for plan in self._plans.values():
            plan.free()
        self._plans.clear()

    def close(self):
        self._free_plans()
        self.comm.Free()


class _Packet(typing.NamedTuple):
    """A peer's packet as received: its prefix's fields, and the buffer it lies in."""

    peer: int
    flags: int
    length: int  # of the pickled Message
    rows: int  # of an allgather's data
    calls: int
    waited: float
    buffer: bytearray


class _Plan:
    """What a call needs each time it comes again: its Message pickled, whether its data comes
    along (decided from what the ranks compare, so that where they agree they decide alike; an
    allgather's rows may differ, so each rank also says whether it sent them), its packet in a
    buffer of its own, a buffer per peer, shared (with room for a longer description than this
    rank's, which is a mismatch to report), persistent requests that send and receive them, views
    of the data in them, and what combines the data."""

    def __init__(self, message, comm, me, peers, inbox):
        self.header = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        data_at = _aligned(_PREFIX.size + len(self.header))
        # Host arrays, uncompressed, of the kinds the ranks can finish themselves: carried when small.
        self.direct = (message.kind in _CARRIED_KINDS and message.problem is None and message.device == "cpu"
                       and message.compression == "none")
        nbytes = np.dtype(message.dtype).itemsize * message.count if self.direct else 0
        self.carries = self.direct and nbytes * max(len(peers), 1) <= DATA_BYTES
        self.sends = self.carries and (message.kind != "broadcast" or message.root == me)
        self.ragged = message.kind == "allgather"  # the ranks' first dimensions may differ
        self.rows = message.shape[0] if self.ragged and message.shape else 0
        self.out = bytearray(data_at + (nbytes if self.sends else 0))
        self.out[_PREFIX.size:_PREFIX.size + len(self.header)] = self.header
        # Room for any call's packet that carries data, and a description up to _ROOM bytes longer;
        # in the buffers every plan shares (`inbox`, one per peer: one plain call is in flight at a
        # time, and its data is used before the next), new ones only where they are too small.
        room = data_at + _ROOM + DATA_BYTES // max(len(peers), 1)
        fits = inbox and all(len(buffer) >= room for buffer in inbox.values())
        self.ins = inbox if fits else {peer: bytearray(room) for peer in peers}
        self.receives = [comm.Recv_init(self.ins[peer], peer, _TAG) for peer in peers]
        self.requests = self.receives + [comm.Send_init(self.out, peer, _TAG) for peer in peers]
        self.dtype, self.shape = np.dtype(message.dtype) if message.dtype else None, message.shape
        self.mine = self.theirs = self.combine = self.in_rank_order = None
        if self.carries:
            self.mine = self._view(self.out, data_at, self.shape) if self.sends else None
            self.theirs = {peer: self._view(buffer, data_at, self.shape) for peer, buffer in self.ins.items()}
            if self.sends:
                self.in_rank_order = [self.theirs.get(rank, self.mine) for rank in range(len(peers) + 1)]
            if message.kind in _REDUCING_KINDS:
                self.combine = reduction.ufunc(message.op, message.dtype)

    def data(self, packet):
        """A peer's data, which follows its description: where this rank's would be when the two
        are as long (the ranks' call sites may differ), with its own number of rows."""
        if packet.length == len(self.header) and packet.rows == self.rows:
            return self.theirs[packet.peer]
        shape = (packet.rows, *self.shape[1:]) if self.ragged else self.shape
        return self._view(packet.buffer, _aligned(_PREFIX.size + packet.length), shape)

    def _view(self, buffer, offset, shape):
        return np.frombuffer(buffer, self.dtype, math.prod(shape), offset).reshape(shape)

    def free(self):
        for request in self.requests:
            request.Free()


def _done(requests, message, where):
    """Are these requests done? A packet longer than its buffer can only be another call's: once
    every request is done (so that the ranks stay in step), that is a MismatchError. A peer that
    failed (MPI's fault tolerance) is a RankFailedError, which the survivors go on after."""
    try:
        return MPI.Request.Testall(requests)
    except MPI.Exception as error:
        classes = set()
        for request in requests:
            try:
                wait_until(request.Test)
            except MPI.Exception as failed:
                classes.add(failed.Get_error_class())
        if classes & set(faults.FAILURE_CLASSES):
            raise RankFailedError(f"a peer of {message.kind} {message.name!r}{where} failed ({error})") from error
        raise MismatchError(f"{message.kind} {message.name!r}{where} does not match across ranks: another rank's "
                            f"call is larger than this one's beyond the room for it ({error})") from None


def _aligned(offset):
    return -(-offset // _ALIGN) * _ALIGN
