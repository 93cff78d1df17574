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


def wait_all(requests):
    """Wait until every request completes: poll, spin briefly, then sleep with a growing backoff."""
    if MPI.Request.Testall(requests):
        return
    start = time.perf_counter()
    while time.perf_counter() - start < SPIN_SECONDS:
        if MPI.Request.Testall(requests):
            return
    sleep = 10e-6
    while not MPI.Request.Testall(requests):
        time.sleep(sleep)
        sleep = min(sleep * 2, MAX_SLEEP_SECONDS)


class MPITransport:
    """sendrecv, send and recv between the ranks of one communicator: all an algorithm needs."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size

    def isend(self, buf, dest):
        return self.comm.Isend([buf, MPI.BYTE], dest)

    def irecv(self, buf, source):
        return self.comm.Irecv([buf, MPI.BYTE], source)

    def wait(self, requests):
        wait_all(requests)

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        self.wait([self.irecv(recvbuf, source), self.isend(sendbuf, dest)])

    def send(self, buf, dest):
        self.wait([self.isend(buf, dest)])

    def recv(self, buf, source):
        self.wait([self.irecv(buf, source)])
