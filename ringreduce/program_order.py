"""Plain allreduces in program order: one message to each peer that carries the call's
description and, when it is small, its data.

Why: a tensor-parallel forward pass calls small allreduces many times per step, and waits for
each. Through the engine such a call costs the negotiation's collective, the data's collective
and the Python around both; MPI's own allreduce costs one collective. A plain call blocks its
thread, so a rank's plain allreduces on one process set come in program order, the same on every
rank of a correct program (as MPI requires of collectives on a communicator). That order pairs
the calls up without a negotiation: each rank sends every peer its call's Message (what the
engine would compare) with its prescaled data, receives theirs, and then
- if the messages differ, every rank has seen all of them and raises the same error;
- if they agree and the data came along, combines the contributions in rank order, so that every
  rank gets the same result bit for bit;
- if they agree and the call is large, on a GPU or compressed (no data came), the caller runs it
  through the engine as before: the exchange only checked it.

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
from ringreduce.engine.negotiation import Stragglers
from ringreduce.errors import MismatchError, PeerExitedError, RingReduceError, StallError, ranks_text
from ringreduce.machine.transport import MAX_SLEEP_SECONDS, YIELD_SECONDS, wait_until

MAX_RANKS = 8  # above this, sending every peer a message costs more than the engine's collectives
DATA_BYTES = 64 << 10  # the most data a rank sends its peers together for one call
_TAG = 1
_JOINED = 1  # flags: the sender has joined and stands in with the op's identity
# flags, length of the pickled Message, call number, seconds waited for the others in the call before
_PREFIX = struct.Struct("<BxxxIQd")
_ALIGN = 8


def available(comm, config):
    """Can this communicator's plain allreduces run in program order? Decided together (a
    collective call): every rank must take the same path."""
    mine = config.program_order and MPI.Query_thread() == MPI.THREAD_MULTIPLE and comm.size <= MAX_RANKS
    return bool(comm.allreduce(int(mine), op=MPI.MIN))


class ProgramOrder:
    """The plain allreduces of one domain on this rank, over a communicator of their own."""

    def __init__(self, comm, ranks, engine, where):
        """`comm` is owned from now on; `ranks` are its ranks as the user knows them, `engine` the
        domain's (whose view of the other ranks tells a peer that left), `where` names the set."""
        self.comm, self.ranks, self.engine, self.where = comm, list(ranks), engine, where
        self.me, self.size = comm.rank, comm.size
        self.peers = [r for r in range(self.size) if r != self.me]
        self.calls = 0  # plain calls so far: the same count on every rank in step
        self.ran = 0  # of which ran here (the others through the engine)
        self._plans = {}  # Message -> _Plan
        self._out = bytearray(_ALIGN)
        self._written = None  # the plan whose header _out holds
        self._in = {peer: bytearray(_ALIGN) for peer in self.peers}
        self._status = MPI.Status()
        self._broken = None
        self._waited = 0.0  # in the last call, for the others' packets
        self.stragglers = Stragglers(self.size)  # who came last to the plain calls, as the engine's cycles

    def run(self, message, array, output):
        """Meet the other ranks' call of this place in program order: `message` is this rank's
        (checked), `array` its input and `output` where an allreduce's result goes (None: a new
        array). Returns (True, result) when that ran the call, (False, None) when the engine must
        (the ranks agree, but no data came along)."""
        if self.engine.failure is not None:  # the ranks are out of step: every later call fails with it
            raise self.engine.failure
        if self._broken is not None:
            raise RingReduceError(f"plain calls{self.where} no longer pair up in program order on rank "
                                  f"{self.ranks[self.me]}: an earlier one failed here ({self._broken})")
        recording = self.engine.timeline.recording
        started = time.perf_counter() if recording else None
        plan = self._plan(message)
        if len(self._out) < plan.length:
            self._out, self._written = bytearray(plan.length), None
        _PREFIX.pack_into(self._out, 0, 0, len(plan.header), self.calls, self._waited)
        if self._written is not plan:
            self._out[_PREFIX.size:_PREFIX.size + len(plan.header)] = plan.header
            self._written = plan
        mine = plan.data(self.me, self._out)
        if plan.carries:
            ops.scale(array, message.prescale, out=mine)
        sends = [self.comm.Isend([self._out, plan.length, MPI.BYTE], peer, _TAG) for peer in self.peers]
        sent_wait = self._waited
        try:
            received = self._receive(message)
            if not MPI.Request.Testall(sends):  # the peers are in this call: they take them soon
                wait_until(lambda: MPI.Request.Testall(sends))
        except BaseException as error:
            self._broken = f"{type(error).__name__}: {error}"
            raise
        number, self.calls = self.calls, self.calls + 1
        joined = [packet for packet in received if packet.flags & _JOINED]
        self._check(message, plan.header, received, number)
        if number and not joined:
            self._record_waits(received, sent_wait)
        if plan.carries:
            result = self._combine(message, plan, mine, received, output)
        elif message.kind == "barrier" and not joined:
            result = None  # every rank has arrived (a joined one is the engine's to refuse)
        else:
            return False, None
        self.ran += 1
        if recording:
            self.engine.timeline.phase(message.name, message.kind.upper(), started, time.perf_counter(), flush=True)
        return True, result

    def _plan(self, message):
        plan = self._plans.get(message)
        if plan is None:
            if len(self._plans) >= 1024:  # a program that makes ever new calls: keep what recent ones need
                self._plans.clear()
            plan = self._plans[message] = _Plan(message, len(self.peers))
        return plan

    def _receive(self, message):
        """Every peer's _Packet, waiting as transport.wait_until does, and telling a peer that left
        or a stall from a wait that goes on."""
        received, waiting = [], list(self.peers)
        started = time.perf_counter()
        warned = told_async = False
        while True:
            for peer in list(waiting):
                incoming = self.comm.Improbe(peer, _TAG, self._status)
                if incoming is not None:
                    received.append(_Packet(peer, *self._take(incoming, peer)))
                    waiting.remove(peer)
            if not waiting:
                self._waited = time.perf_counter() - started
                return received
            waited = time.perf_counter() - started
            if waited < YIELD_SECONDS:
                os.sched_yield()
                continue
            with self.engine.waiters:  # this rank is blocked: what tells a deadlock of the others' requests
                time.sleep(min(waited / 4, MAX_SLEEP_SECONDS))
            self._check_others(message, waiting, waited)
            if not told_async:
                told_async = self._tell_async(message, waiting)
            if not warned and waited >= self.engine.config.stall_check_seconds:
                warned = True
                report_stall(self.ranks[self.me], self._stall_text(message, waiting, waited),
                             self.engine.config.stall_stacks)

    def _take(self, incoming, peer):
        count = self._status.Get_count(MPI.BYTE)
        if len(self._in[peer]) < count:
            self._in[peer] = bytearray(count)
        incoming.Recv([self._in[peer], count, MPI.BYTE])
        return (*_PREFIX.unpack_from(self._in[peer]), self._in[peer])

    def _check_others(self, message, waiting, waited):
        """Raise when waiting on cannot end well: a peer left, the engine broke, or the stall
        shutdown time (RINGREDUCE_STALL_SHUTDOWN_TIME) has passed."""
        if self.engine.failure is not None:
            raise self.engine.failure
        # A peer sends its packet before it can leave; it may come in just after the engine saw it go.
        left = [peer for peer in waiting if peer in self.engine.leaving and not self.comm.Iprobe(peer, _TAG)]
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
        """Raise the same error on every rank where the ranks' calls (this rank's `number`th) differ."""
        headers, differ = {}, False
        for packet in received:
            if packet.flags & _JOINED:
                continue
            if packet.calls != number:
                raise MismatchError(
                    f"plain calls{self.where} are out of step: this is call {number + 1} in program order on "
                    f"rank {self.ranks[self.me]} but call {packet.calls + 1} on rank {self.ranks[packet.peer]} (a "
                    "call that failed on one rank only, or plain calls made from two threads at once)")
            theirs = headers[self.ranks[packet.peer]] = packet.buffer[_PREFIX.size:_PREFIX.size + packet.length]
            differ = differ or theirs != header
        if not differ:
            return
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
                                                                 f"{ranks_text(who)}" for name, who in names.items()))
        if error is not None:
            raise error

    def _record_waits(self, received, sent_wait):
        """Each packet says how long its sender waited in the call before: every rank records the
        same waits, and so names the same straggler (one call late)."""
        waits = [sent_wait] * self.size
        for packet in received:
            waits[packet.peer] = packet.waited
        self.stragglers.record(waits)

    def _combine(self, message, plan, mine, received, output):
        """The contributions combined in rank order (the same rounding on every rank), scaled;
        into `output`, or a new array. A joined rank adds the identity: nothing."""
        parts = {self.me: mine}
        for packet in received:
            if not packet.flags & _JOINED:
                parts[packet.peer] = plan.data(packet.peer, packet.buffer)
        parts = [parts[rank] for rank in sorted(parts)]
        if len(parts) == 1:
            result = mine.copy() if output is None else output
            if output is not None:
                np.copyto(output, mine)
        else:
            combine = ops.ufunc(message.op)
            result = combine(parts[0], parts[1], out=output)
            if output is None and not isinstance(result, np.ndarray):  # 0-d arrays combine into a scalar
                result = np.asarray(result)
            for part in parts[2:]:
                combine(result, part, out=result)
        if message.op == ops.Average or message.postscale != 1.0:
            ops.scale_result(result, message.op, self.size, message.postscale)
        return result

    def answer_as_joined(self, done):
        """Until done(): answer every plain allreduce of the others as a joined rank (with the op's
        identity), adopting their call count, so that this rank is in step once all have joined."""
        answer = bytearray(_PREFIX.size)
        _PREFIX.pack_into(answer, 0, _JOINED, 0, 0, 0.0)
        found = []

        def arrived():
            incoming = None if done() else self.comm.Improbe(MPI.ANY_SOURCE, _TAG, self._status)
            found[:] = [] if incoming is None else [incoming]
            return incoming is not None or done()

        with self.engine.waiters:
            while True:
                wait_until(arrived)
                if not found:
                    return
                peer = self._status.Get_source()
                packet = _Packet(peer, *self._take(found[0], peer))
                self.calls = packet.calls + 1
                self.comm.Send(answer, peer, _TAG)

    def stranded(self):
        """While this rank shuts down (on the engine's thread): what a peer's plain call waits for
        from it, as the peer's PeerExitedError will say, or None."""
        incoming = self.comm.Improbe(MPI.ANY_SOURCE, _TAG, self._status)
        if incoming is None:
            return None
        peer = self._status.Get_source()
        packet = _Packet(peer, *self._take(incoming, peer))
        if packet.flags & _JOINED:
            return None
        message = pickle.loads(packet.buffer[_PREFIX.size:_PREFIX.size + packet.length])
        return (f"rank {self.ranks[self.me]} shut down while rank {self.ranks[peer]} waited in plain {message.kind} "
                f"{message.name!r}{self.where}; every rank must make the same collective calls")

    def _text(self, peers):
        return ranks_text(sorted(self.ranks[p] for p in peers))

    def close(self):
        self.comm.Free()


class _Packet(typing.NamedTuple):
    """A peer's packet as received: its prefix's fields, and the buffer it lies in."""

    peer: int
    flags: int
    length: int  # of the pickled Message
    calls: int
    waited: float
    buffer: bytearray


class _Plan:
    """What a call needs each time it comes again: its Message pickled, whether its data comes
    along (decided from what the ranks compare, so that where they agree they decide alike), the
    packet's length, and views of the data in the buffers it arrives in."""

    def __init__(self, message, peers):
        self.header = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.data_at = _aligned(_PREFIX.size + len(self.header))
        self.carries = (message.kind == "allreduce" and message.problem is None and message.device == "cpu"
                        and message.compression == "none"
                        and np.dtype(message.dtype).itemsize * message.count * max(peers, 1) <= DATA_BYTES)
        self.dtype = np.dtype(message.dtype) if self.carries else None
        self.shape = message.shape
        self.length = self.data_at + (self.dtype.itemsize * message.count if self.carries else 0)
        self._views = {}  # rank -> (buffer, the data's view in it)

    def data(self, rank, buffer):
        """The data of `rank`'s packet in `buffer` (a bytearray), as an array."""
        if not self.carries:
            return None
        known = self._views.get(rank)
        if known is None or known[0] is not buffer:
            view = np.frombuffer(buffer, self.dtype, math.prod(self.shape), self.data_at).reshape(self.shape)
            known = self._views[rank] = (buffer, view)
        return known[1]


def _aligned(offset):
    return -(-offset // _ALIGN) * _ALIGN
