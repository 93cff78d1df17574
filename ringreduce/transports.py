"""Point-to-point transfers over MPI, and the one way ringreduce waits for them.

Data moves through mpi4py's buffer interface as raw bytes: no pickling, no typed
datatypes, so any dtype travels the same way. Waiting never blocks inside MPI (a rank
blocked in MPI spins a whole core, which on a CPU machine is the training computation's):
it polls, spins briefly for low latency, then sleeps with a growing backoff.
"""

import time

from mpi4py import MPI

SPIN_SECONDS = 50e-6
MAX_SLEEP_SECONDS = 1e-3
IDLE_CHECK_SECONDS = 5e-3


def wait_all(requests, on_idle=None):
    """Wait until every request completes; `on_idle` runs every few ms of waiting and may raise.

    If it raises, the unfinished receives are cancelled so their buffers are not written later.
    """
    if MPI.Request.Testall(requests):
        return
    start = time.perf_counter()
    while time.perf_counter() - start < SPIN_SECONDS:
        if MPI.Request.Testall(requests):
            return
    sleep = 10e-6
    last_check = time.perf_counter()
    while not MPI.Request.Testall(requests):
        time.sleep(sleep)
        sleep = min(sleep * 2, MAX_SLEEP_SECONDS)
        now = time.perf_counter()
        if on_idle is not None and now - last_check >= IDLE_CHECK_SECONDS:
            last_check = now
            try:
                on_idle()
            except BaseException:
                _cancel(requests)
                raise


def _cancel(requests):
    for request in requests:
        if request != MPI.REQUEST_NULL:
            try:
                request.Cancel()
            except MPI.Exception:
                pass


class MPITransport:
    """sendrecv, send and recv between the ranks of one communicator: all an algorithm needs."""

    def __init__(self, comm, on_idle):
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self._on_idle = on_idle

    def isend(self, buf, dest):
        return self.comm.Isend([buf, MPI.BYTE], dest)

    def irecv(self, buf, source):
        return self.comm.Irecv([buf, MPI.BYTE], source)

    def wait(self, requests):
        wait_all(requests, self._on_idle)

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        self.wait([self.irecv(recvbuf, source), self.isend(sendbuf, dest)])

    def send(self, buf, dest):
        self.wait([self.isend(buf, dest)])

    def recv(self, buf, source):
        self.wait([self.irecv(buf, source)])
