"""A request the caller hands to the engine, and the handle the caller keeps."""

import dataclasses
import threading
import time

from ringreduce.engine.flight_recorder import FlightRecorder

NEW, CACHED, ANNOUNCED = "new", "cached", "announced"


def timed_out(what, timeout):
    """The TimeoutError of a wait for `what` that the caller gave `timeout` seconds."""
    return TimeoutError(f"{what} did not finish within {timeout:g} s")


class Waiters:
    """How many of this process's threads are blocked in a handle's wait(): a rank with one is
    waiting for the others, which is what tells a deadlock from a rank still computing."""

    def __init__(self):
        self._count = 0
        self._lock = threading.Lock()

    @property
    def any(self):
        return self._count > 0

    def __enter__(self):
        with self._lock:
            self._count += 1

    def __exit__(self, *exc):
        with self._lock:
            self._count -= 1


class Handle:
    """The result of an async collective, once the engine has it: poll it or wait for it."""

    def __init__(self, name, waiters=None):
        self.name = name
        self._waiters = waiters
        # Held until finish(); any thread may release a Lock. Far cheaper to make than an Event,
        # and a handle is made for every call.
        self._pending = threading.Lock()
        self._pending.acquire()
        self._result = None
        self._error = None
        self.flight = None  # its flight recorder entry, which finish() marks done

    def done(self):
        return not self._pending.locked()

    def succeeded(self):
        return self.done() and self._error is None

    def wait(self, timeout: float | None = None):
        """The result, once the engine has it; a TimeoutError after `timeout` seconds without."""
        if self._waiters is not None and self._pending.locked():
            with self._waiters:
                finished = self._pending.acquire(timeout=-1 if timeout is None else timeout)
        else:
            finished = self._pending.acquire(timeout=-1 if timeout is None else timeout)
        if not finished:
            raise timed_out(self.name, timeout)
        self._pending.release()
        if self._error is not None:
            raise self._error
        return self._result

    def finish(self, result=None, error=None):
        if self._pending.locked():  # the first outcome stands
            self._result, self._error = result, error
            if self.flight is not None:
                FlightRecorder.finished(self.flight)
            self._pending.release()

    def __repr__(self):
        return f"<ringreduce handle {self.name!r} {'done' if self.done() else 'pending'}>"


@dataclasses.dataclass(eq=False)
class Request:
    """What the engine needs to run one collective for this rank."""

    message: object  # agreement.Message
    handle: Handle
    input: object = None  # the array this rank contributes
    output: object = None  # where the result goes (None: allocated when the size is known)
    splits: list | None = None  # alltoall: rows sent to each rank
    return_splits: bool = False
    ready: object = None  # device arrays: a CUDA event recorded on the caller's stream at submission
    state: str = NEW
    slot: int | None = None
    submitted: float = dataclasses.field(default_factory=time.perf_counter)
    negotiated: float | None = None  # when this rank's part of the negotiation was done

    @property
    def name(self):
        return self.message.name
