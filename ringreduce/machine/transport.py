"""Point-to-point transfers over MPI, persistent allreduces on fixed buffers, and the one way
ringreduce waits for them.

Data moves through mpi4py's buffer interface as raw bytes: no pickling, no typed
datatypes, so any dtype travels the same way. Waiting never blocks inside MPI (a rank
blocked in MPI spins a whole core, which on a CPU machine is the training computation's):
it polls, yielding the core, for low latency, then sleeps with a growing backoff.
"""

import os
import time

import numpy as np
from mpi4py import MPI

from ringreduce.machine import faults

YIELD_SECONDS = 200e-6
# The MPI library's own collectives take their internal steps only while a call polls them (MPICH
# and Open MPI run no progress thread by default): a rank asleep holds up every step it is part of.
# On 4 ranks of 2 cores their 64 KiB-1 MiB allreduces took 5.9-11.8 ms polled for 200 us, 0.4-2.1
# ms polled for 2 ms (docs/performance.md).
COLLECTIVE_YIELD_SECONDS = 2e-3
MAX_SLEEP_SECONDS = 1e-3


def wait_until(done, yield_seconds=YIELD_SECONDS):
    """Return once done() is true, without holding a core: poll, yielding the core to any other
    runnable process, for a short while (`yield_seconds`: partners usually arrive within
    microseconds), then sleep a quarter of the time waited so far, at most 1 ms: a late partner is
    noticed at most a quarter late, and a long wait costs one wake-up per millisecond."""
    if done():
        return
    start = time.perf_counter()
    while time.perf_counter() - start < yield_seconds:
        os.sched_yield()
        if done():
            return
    while not done():
        faults.check()  # a dead rank would never let it be done
        time.sleep(min((time.perf_counter() - start) / 4, MAX_SLEEP_SECONDS))


def wait_all(requests, yield_seconds=YIELD_SECONDS):
    """Wait until every MPI request completes (see wait_until), polling afresh after each one that
    does: a transfer in many pieces moves a piece per progress call, and a wait already asleep
    would let each piece wait out a sleep (64 MiB in 4 MiB pieces took twice as long as in one
    message, in 1 MiB pieces 5.6x; docs/performance.md)."""
    pending = list(requests)

    def some_done():
        finished = set(MPI.Request.Testsome(pending) or ())
        pending[:] = [request for index, request in enumerate(pending) if index not in finished]
        return not pending or bool(finished)

    while pending:
        wait_until(some_done, yield_seconds)


class PersistentAllreduce:
    """An allreduce of the same buffers, count and op, run again at every call: an MPI-4
    persistent collective, set up once, where the library has them (each start skips the argument
    checks and the schedule that a fresh nonblocking call builds), else a fresh nonblocking call
    each time. Setting one up is a collective call: every rank must make the same ones in the
    same order. Each call waits as wait_all does, polling for `yield_seconds` before it sleeps."""

    def __init__(self, comm, sendbuf, recvbuf, op, yield_seconds=YIELD_SECONDS):
        self._fresh = lambda: comm.Iallreduce(sendbuf, recvbuf, op)
        self._yield_seconds = yield_seconds
        try:
            self._request = comm.Allreduce_init(sendbuf, recvbuf, op)
        except (NotImplementedError, MPI.Exception):  # an MPI before 4.0
            self._request = None
        self.persistent = self._request is not None

    def __call__(self):
        if self._request is None:
            wait_all([self._fresh()], self._yield_seconds)
        else:
            self._request.Start()
            wait_until(self._request.Test, self._yield_seconds)

    def free(self):
        if self._request is not None:
            self._request.Free()
            self._request = None


def _bytes(buf):
    """What mpi4py takes: numpy exports no buffer for a dtype of its extensions (ml_dtypes'
    bfloat16, which the wire uses for Compression.bf16); their bytes are the same."""
    return buf.view(np.uint8) if buf.dtype.kind == "V" else buf


class MPITransport:
    """Point-to-point transfers between the ranks of one communicator: all an algorithm needs."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size

    def isend(self, buf, dest):
        return self.comm.Isend([_bytes(buf), MPI.BYTE], dest)

    def irecv(self, buf, source):
        return self.comm.Irecv([_bytes(buf), MPI.BYTE], source)

    def wait(self, requests):
        wait_all(requests)

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        self.wait([self.irecv(recvbuf, source), self.isend(sendbuf, dest)])
