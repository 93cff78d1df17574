"""The background engine: after init, the cycles that talk to MPI run one at a time, under a lock.

Callers enqueue requests and keep handles. Each cycle the engine tells the other ranks
what it has pending (wire.py: one small allreduce in the steady state; new names are
announced in full once), runs the shared negotiation, and executes what is ready everywhere,
fused, in the agreed order. The cycles run on the engine thread, or on a caller's thread that
waits for its own request while no other thread runs one (wait_for): any thread can run a
rank's next cycle, as long as the cycles run one after the other.

Between cycles the engine sleeps until a request arrives or the cycle time passes: the
cycle time bounds how long a ready request waits, it does not delay a lone call. A rank with
nothing pending sleeps longer (IDLE_SECONDS): no request can become ready without its own
submission, which wakes it at once, so the short pace would only burn its core.
"""

import collections
import faulthandler
import sys
import threading
import time

from ringreduce.engine import fusion, gpu_turn
from ringreduce.engine.negotiation import Negotiator
from ringreduce.engine.requests import Waiters
from ringreduce.engine.wire import RankState
from ringreduce.errors import PeerExitedError, RankFailedError, RingReduceError
from ringreduce.execution.host import Executor

_JOIN, _SHUTDOWN = object(), object()
IDLE_SECONDS = 0.1


class Engine:
    def __init__(self, wire, algorithms, config, timeline, device_family=None, release=None, on_stranded=None,
                 ranks=None, where="", caller_algorithms=None):
        """The cycles talk through `wire` and run collectives with `algorithms`; `device_family()`
        builds the transport for CuPy arrays. `caller_algorithms`, on communicators of their own,
        run the calls that a caller's thread runs itself once the ranks have met in program order
        (engine/plain_calls.py), beside whatever the cycles run. After the last cycle of a
        shutdown the engine closes them all and calls `release()` (the communicators they ran on
        are the caller's). A rank that leaves while others wait for it calls `on_stranded(why)`
        once. `ranks` are the ranks of the engine's communicator as the user knows them (a process
        set's global ranks), and `where` names the set in messages."""
        self.wire = wire
        self.algorithms = algorithms
        self.rank, self.size = wire.rank, wire.size
        self.ranks = list(ranks) if ranks is not None else list(range(self.size))
        self.global_rank = self.ranks[self.rank]
        self.config = config
        self.timeline = timeline
        self._release = release
        self._on_stranded = on_stranded
        self.negotiator = Negotiator(self.size, config.cache_capacity, config.stall_check_seconds,
                                     config.stall_shutdown_seconds, config.deadlock_seconds, self.ranks, where)
        self.waiters = Waiters()  # the handles of this engine's requests count their blocked waits here
        self.executor = Executor(algorithms, self.rank, self.size, timeline, device_family)
        self.caller_executor = (Executor(caller_algorithms, self.rank, self.size, timeline)
                                if caller_algorithms is not None else None)
        self.stats = dict.fromkeys(("cycles", "cycles_with_work", "collectives", "tensors", "bytes", "announced"), 0)
        self._incoming = collections.deque()
        # Guards _incoming and _failure. The engine thread sleeps on _wakeup, a condition over the
        # same lock; taking the plain lock is cheaper than entering the condition (Python code).
        self._queue_lock = threading.Lock()
        self._wakeup = threading.Condition(self._queue_lock)
        self._cycling = threading.Lock()  # held by whichever thread runs a cycle
        self._pace = True
        self._pending = {}  # name -> Request, in submission order
        self._device_pending = 0  # how many of them are on the GPU
        self._names_in_flight = set()  # of requests submitted and not finished (added under _queue_lock)
        self._join_handle = None
        self._shutdown_handle = None
        self._failure = None  # set if the engine itself broke: every later request gets it
        self._reported_leaving = False
        self._no_announcements = ((),) * self.size
        self._waited = 0.0  # seconds this rank waited in the last negotiation
        self.leaving = frozenset()  # the ranks (by index) that said in the last cycle that they shut down
        # While this rank shuts down: what a plain call of another rank waits for from it, or None
        # (set by whoever runs the plain calls, which pass the engine by).
        self.plain_call_stranded = None
        self._thread = threading.Thread(target=self._run, name="ringreduce-engine", daemon=True)
        self._thread.start()

    # ---- the caller's side ------------------------------------------------------------

    def submit(self, request, wake=True):
        """Queue a request; `wake=False` when the caller will run the cycles itself (wait_for).
        A request named as one still in flight on this rank is a ValueError here, at once (as
        Horovod): its result could not be told from the first one's."""
        with self._queue_lock:
            if self._failure is not None:
                if isinstance(request, tuple):  # a broken engine has stopped: leaving it needs nothing
                    kind, handle = request
                    handle.finish(error=None if kind is _SHUTDOWN else self._failure)
                else:
                    request.handle.finish(error=self._failure)
                return
            if not isinstance(request, tuple):
                if request.name in self._names_in_flight:
                    raise ValueError(
                        f"{request.message.kind} {request.name!r} was submitted on rank {self.global_rank} while a "
                        "request of that name is still in flight there; give each in-flight request its own name")
                self._names_in_flight.add(request.name)
            self._incoming.append(request)
            if wake:
                self._wakeup.notify()

    def record_to(self, timeline):
        """Record into `timeline` from the next cycle on; the one recorded into so far is closed."""
        with self._cycling:
            previous, self.timeline = self.timeline, timeline
            self.executor.timeline = timeline
        previous.close()

    def busy(self):
        """Has this rank requests in flight here?"""
        with self._queue_lock:
            return bool(self._incoming or self._pending or self._join_handle)

    def join(self, handle):
        self.submit((_JOIN, handle))

    def shutdown(self, handle):
        self.begin_shutdown(handle)
        self.stopped()

    def begin_shutdown(self, handle):
        """Start leaving: the other ranks hear it in the next cycle; `handle` is done once every
        rank has shut down."""
        self.submit((_SHUTDOWN, handle))

    def stopped(self):
        """Wait for the engine thread to end (after a shutdown)."""
        self._thread.join()

    def wait_for(self, handle):
        """Wait for `handle`, running the cycles on this thread while no other thread runs one;
        hand over to the engine thread when one does, or when every rank is waiting on others."""
        while not handle.done():
            if self._shutdown_handle is not None or not self._cycling.acquire(blocking=False):
                break
            try:
                self._cycle_once()
            except BaseException as error:  # a cycle cut short leaves the ranks out of step: fail everything
                self._break(error)
                if not isinstance(error, Exception):
                    raise  # Ctrl-C or exit in the caller's thread: the caller's, not the request's
            finally:
                self._cycling.release()
            if self._pace:  # every rank has something in flight: keep the cycle time, on the engine thread
                break
        with self._queue_lock:
            if self._incoming or self._pending or self._join_handle or self._shutdown_handle:
                self._wakeup.notify()
        return handle.wait()

    # ---- the engine thread --------------------------------------------------------------

    def _run(self):
        try:
            while True:
                with self._queue_lock:
                    if self._failure is not None:
                        return  # broken by a cycle on a caller's thread: the ranks are out of step
                    busy = self._pending or self._join_handle or self._shutdown_handle
                    ticked = False
                    if not self._incoming and (self._pace or not busy):
                        ticked = not self._wakeup.wait(self.config.cycle_time_ms / 1000 if busy else IDLE_SECONDS)
                with self._cycling:
                    if self._failure is not None:
                        return
                    if not (ticked or self._incoming or self._pending or self._join_handle or self._shutdown_handle):
                        continue  # woken for requests that a waiting caller's cycles already ran
                    if self._cycle_once():
                        break
        except RankFailedError as error:  # the job shrinks (ringreduce.elastic): nothing more to say here
            self._break(error)
            return
        except BaseException as error:  # the engine cannot go on: fail everything, now and later
            self._break(error)
            raise
        finally:
            self.timeline.close()
        self._finish_shutdown()

    def _cycle_once(self):
        """One cycle with whatever has arrived (the caller holds self._cycling); True when every
        rank has shut down."""
        with self._queue_lock:
            arrived = list(self._incoming)
            self._incoming.clear()
        outcome, states = self._cycle(arrived)
        # A rank with nothing in flight joins the next cycle only when it gets a request (or
        # ticks), so waiting for it costs no pace: start that cycle at once, and its request
        # completes it. When every rank has something in flight, keep the pace.
        self._pace = all(state.waiting for state in states)
        return outcome.all_shut_down

    def _cycle(self, arrived):
        started = time.perf_counter()
        for item in arrived:
            self._accept(item)
        # A set's device collectives run only in a cycle where each member holds its GPU's turn. A
        # joined rank takes it too: it runs whatever its set agrees.
        needs_gpu = self._device_pending > 0 or self._join_handle is not None
        holds_gpu = needs_gpu and gpu_turn.take()
        try:
            return self._cycle_with(started, gpu_taken=needs_gpu and not holds_gpu)
        finally:
            if holds_gpu:
                gpu_turn.give_back()

    def _cycle_with(self, started, gpu_taken):
        """The cycle's exchange, negotiation and execution; `gpu_taken`: this rank needs its GPU's
        turn, and another set's cycle holds it (engine/gpu_turn.py)."""
        announce, slots = self.negotiator.cache.outgoing(self._pending.values(), self.rank)
        states = self._exchange_states(announce, slots, gpu_taken)
        negotiated = time.perf_counter()
        for request in self._pending.values():
            if request.negotiated is None:
                request.negotiated = negotiated
        if any(s.announces for s in states):
            announcements = self.wire.announcements(announce)
            self.stats["announced"] += sum(map(len, announcements))
        else:
            announcements = self._no_announcements
        outcome = self.negotiator.negotiate(states, announcements, started)
        self.stats["cycles"] += 1
        if outcome.responses or self._shutdown_handle is not None:
            self._report_stranded(outcome.responses)
        if outcome.responses:
            self._execute(outcome.responses, started)
        if outcome.join_done is not None and self._join_handle is not None:
            self._join_handle.finish(outcome.join_done)
            self._join_handle = None
        if outcome.stall_warning:
            report_stall(self.global_rank, outcome.stall_warning, self.config.stall_stacks)
        return outcome, states

    def _accept(self, item):
        if isinstance(item, tuple):
            kind, handle = item
            if kind is _JOIN:
                self._join_handle = handle
            else:
                self._shutdown_handle = handle
                for name in list(self._pending):
                    request = self._drop(name)
                    request.handle.finish(error=RingReduceError(
                        f"shutdown() was called on rank {self.global_rank} while {request.message.kind} "
                        f"{name!r} was still pending"))
            return
        request = item
        if self._shutdown_handle is not None:
            self._names_in_flight.discard(request.name)
            request.handle.finish(error=RingReduceError(f"ringreduce is shutting down on rank {self.global_rank}"))
        else:
            self._pending[request.name] = request
            if request.message.device == "cuda":
                self._device_pending += 1

    def _drop(self, name):
        """A pending request that is finished here, out of the engine's books."""
        request = self._pending.pop(name)
        self._names_in_flight.discard(name)
        if request.message.device == "cuda":
            self._device_pending -= 1
        return request

    def _exchange_states(self, announce, slots, gpu_taken):
        waiting = bool(self._pending or self._join_handle or self._shutdown_handle)
        now = time.perf_counter()
        mine = RankState.of(slots, self._waited, announces=bool(announce), joined=self._join_handle is not None,
                            shutting_down=self._shutdown_handle is not None, stalled=self.negotiator.stall_due(now),
                            waiting=waiting, gpu_taken=gpu_taken,
                            deadlocked=self.waiters.any and self.negotiator.deadlock_suspected(now))
        started = time.perf_counter()
        states = self.wire.states(mine)
        self._waited = time.perf_counter() - started
        self.leaving = frozenset(rank for rank, state in enumerate(states) if state.shutting_down)
        return states

    def _execute(self, responses, cycle_started):
        groups = fusion.plan(responses, self.config.fusion_threshold_bytes)
        for group in groups:
            # They leave _pending once finished: if the collective raises, _break fails them.
            requests = [self._pending.get(r.name) for r in group]
            if self.timeline.recording:
                for response, request in zip(group, requests, strict=True):
                    if request is not None:
                        self.timeline.phase(response.name, "NEGOTIATE", request.submitted, request.negotiated)
                        self.timeline.phase(response.name, "WAIT_FOR_OTHER_RANKS", request.negotiated, cycle_started)
            error = group[0].error
            if error is None:
                results = self.executor.run(group, requests)
                self.stats["collectives"] += group[0].message.kind != "barrier"
                self.stats["bytes"] += sum(fusion.wire_bytes(r.message) for r in group)
            for index, request in enumerate(requests):
                if request is not None:
                    self._drop(request.name)
                    request.handle.finish(None if error else results[index], error)
        self.stats["tensors"] += len(responses)
        self.stats["cycles_with_work"] += 1
        if self.timeline.recording:
            self.timeline.cycle(self.stats["cycles"], cycle_started, len(responses), len(groups))

    def _report_stranded(self, responses):
        """When this rank is leaving while others wait for it, say so at once (to rrun): if the
        others then fail because of it, this rank is named, whose own exit would come too late."""
        if self._shutdown_handle is None or self._reported_leaving or self._on_stranded is None:
            return
        stranded = [str(r.error) for r in responses if isinstance(r.error, PeerExitedError)
                    and r.name not in self._pending]
        if not stranded and self.plain_call_stranded is not None:
            stranded = [why for why in (self.plain_call_stranded(),) if why]
        if stranded:
            self._reported_leaving = True
            self._on_stranded(stranded[0])

    def _break(self, cause):
        """Fail everything in flight and every later request, with `cause` chained to the error they
        raise (its traceback is not lost); the engine thread stops."""
        failure = RingReduceError(f"the ringreduce engine on rank {self.global_rank} failed: {cause!r}")
        failure.__cause__ = cause
        with self._queue_lock:
            self._failure = failure
            self._wakeup.notify()
            waiting = list(self._pending.values()) + [r for r in self._incoming if not isinstance(r, tuple)]
            handles = [r.handle for r in waiting] + [h for h in (self._join_handle, self._shutdown_handle) if h]
            self._pending.clear()
            self._device_pending = 0
            self._incoming.clear()
            self._names_in_flight.clear()
        for handle in handles:
            handle.finish(error=failure)

    def abandon(self, cause):
        """Stop without the shutdown every rank would have to join: a rank of the job has failed.
        Everything in flight fails with `cause`; the thread ends."""
        self._break(cause)
        self._thread.join(timeout=5)

    def _finish_shutdown(self):
        self.algorithms.close()
        if self.caller_executor is not None:
            self.caller_executor.algorithms.close()
        self.wire.close()
        if self._release is not None:
            self._release()
        self._shutdown_handle.finish()

    @property
    def failure(self):
        """The error of a broken engine, or None."""
        return self._failure


def report_stall(global_rank, warning, stacks):
    """Print a stall warning on this rank's stderr; with `stacks`, where each thread of this rank is
    (the one that others wait for included)."""
    sys.stderr.write(f"[rank {global_rank}] {warning}\n")
    if stacks:
        sys.stderr.write(f"[rank {global_rank}] Python stacks (most recent call first):\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
