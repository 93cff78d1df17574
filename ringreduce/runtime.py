"""This process's ringreduce state: init and shutdown, and what every collective shares
(the communicators, the algorithms, the count of collectives done, the cross-rank check).
"""

import atexit
import contextlib
import os
import pickle
import signal
import sys

import numpy as np
from mpi4py import MPI
from mpi4py.run import set_abort_status

from ringreduce import agreement, algorithms, launched, topology
from ringreduce.algorithms.ring import offsets_of
from ringreduce.arrays import Workspace
from ringreduce.config import Config
from ringreduce.errors import NotInitializedError, PeerExitedError, RingReduceError
from ringreduce.liveness import ExitNotices
from ringreduce.transports import MPITransport

_active = None
_hooks_installed = False


class Runtime:
    def __init__(self, comm, config):
        self.config = config
        self.topology = topology.discover(comm)
        self._data_comm = comm.Dup()
        self._notice_comm = comm.Dup()
        self.notices = ExitNotices(self._notice_comm)
        self.transport = MPITransport(self._data_comm, self._check_partners)
        self.algorithms = algorithms.select(config, self.transport, Workspace())
        self.completed = 0
        self.failing = False
        self._current = None
        self._rows = np.empty((self.topology.size, agreement.RECORD_LENGTH), dtype=np.int64)

    @contextlib.contextmanager
    def collective(self, kind, name):
        """Count one collective; while it runs, waits know what to blame if a partner leaves."""
        call = Call(self, kind, name)
        self._current = call
        try:
            yield call
        finally:
            self.completed += 1
            self._current = None

    def _check_partners(self):
        gone = sorted(r for r, done in self.notices.poll().items() if done <= self.completed)
        if gone:
            who = ", ".join(f"rank {r} (which had completed {self.notices.exited[r]} collectives)" for r in gone)
            raise PeerExitedError(
                f"{who} left the job while rank {self.topology.rank} waited for it in "
                f"{self._current}; every rank must make the same collective calls"
            )

    def gather_rows(self, row):
        """Every rank's row, by one small allgather (MPI's own: nothing is cheaper for 320 bytes)."""
        self.transport.wait([self._data_comm.Iallgather(row, self._rows)])
        return self._rows.copy()

    def allgather_bytes(self, payload):
        """Every rank's byte string; the rare path that explains a disagreement uses it."""
        lengths = np.empty(self.topology.size, dtype=np.int64)
        self.transport.wait([self._data_comm.Iallgather(np.array([len(payload)], dtype=np.int64), lengths)])
        offsets = offsets_of(lengths)
        buf = np.empty(offsets[-1], dtype=np.uint8)
        mine = self.topology.rank
        buf[offsets[mine]:offsets[mine + 1]] = np.frombuffer(payload, dtype=np.uint8)
        self.algorithms.allgather(buf, offsets)
        return [buf[offsets[r]:offsets[r + 1]].tobytes() for r in range(self.topology.size)]

    def close(self):
        self.notices.announce_and_collect(self.completed)
        self._data_comm.Free()
        self._notice_comm.Free()


class Call:
    """One collective call on this rank, from the cross-rank check to its result."""

    def __init__(self, runtime, kind, name):
        self.runtime = runtime
        self.kind = kind
        self.name = name
        self.number = runtime.completed + 1

    def agree(self, check):
        """Run this rank's `check` of its arguments, then make sure every rank's call fits.

        `check` returns the Signature of the arguments or raises TypeError/ValueError; either
        way the ranks compare notes, and all of them raise together if anything is off.
        Returns the rows of every rank's call (the first dimensions of a ragged allgather).
        """
        try:
            signature, problem = check(), None
        except (TypeError, ValueError) as error:
            signature, problem = None, error
        rows = self.runtime.gather_rows(agreement.record(self.kind, self.name, signature, problem))
        if agreement.disagrees(rows):
            problem_text = (type(problem).__name__, str(problem)) if problem else None
            mine = agreement.Description(self.kind, self.name, signature, problem_text)
            gathered = self.runtime.allgather_bytes(pickle.dumps(mine))
            raise agreement.explain([pickle.loads(b) for b in gathered])
        return rows

    def __str__(self):
        name = f" {self.name!r}" if self.name else ""
        return f"{self.kind}{name} (collective #{self.number})"


def init(comm=None):
    """Start ringreduce on `comm` (default: MPI.COMM_WORLD). Calling it again does nothing."""
    global _active
    if _active is not None:
        return
    comm = MPI.COMM_WORLD if comm is None else comm
    _check_launch(comm)
    _active = Runtime(comm, Config.from_env())
    _install_hooks()


def shutdown():
    """Leave the job cleanly: waits until every other rank has shut down too."""
    global _active
    if _active is None:
        return
    runtime, _active = _active, None
    runtime.close()


def is_initialized():
    return _active is not None


def active():
    if _active is None:
        raise NotInitializedError("ringreduce has not been initialized; call ringreduce.init() first")
    return _active


def _check_launch(comm):
    """Catch the classic mix-up of an mpiexec from one MPI and an mpi4py built on another:
    each process then starts as a world of its own."""
    expected = os.environ.get(launched.WORLD_SIZE_VARIABLE)
    if comm != MPI.COMM_WORLD or expected is None or int(expected) == comm.size:
        return
    library = MPI.Get_library_version().splitlines()[0].strip()
    raise RingReduceError(
        f"rrun started {expected} ranks but MPI reports a world of {comm.size}: the mpiexec "
        f"that rrun ran belongs to a different MPI than the one mpi4py loaded ({library}). "
        "Run `rrun --check-build`, and point rrun at the matching mpiexec (--mpiexec or "
        "RRUN_MPIEXEC) or rebuild mpi4py against the site's MPI (see the README)."
    )


def _install_hooks():
    """On an uncaught exception, abort the whole MPI job so the other ranks do not wait for
    this one forever; at a normal exit, shut down cleanly."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    previous = sys.excepthook

    def abort_job_on_uncaught(exc_type, exc, traceback):
        previous(exc_type, exc, traceback)
        if _active is None or _active.topology.size == 1:
            return
        _active.failing = True
        code = 128 + signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
        if launched.under_rrun():
            error = f"{exc_type.__module__}.{exc_type.__qualname__}: {exc}".removeprefix("builtins.")
            sys.stderr.buffer.write(launched.status_line(_active.topology.rank, code, error))
            sys.stderr.flush()
        set_abort_status(code)

    sys.excepthook = abort_job_on_uncaught
    atexit.register(_shutdown_at_exit)


def _shutdown_at_exit():
    if _active is not None and not _active.failing:
        shutdown()
