"""Exit notices: how a rank learns that a partner has left the job.

A rank that shuts down (at the end of its script, or early) tells every other rank how
many collectives it completed, on a communicator used for nothing else. A rank waiting in
collective number k that hears from a partner who completed fewer than k knows the
partner will never arrive, and raises instead of hanging. At a normal end every rank
receives every other rank's notice, so no message is left unmatched at MPI_Finalize.
"""

import numpy as np
from mpi4py import MPI

from ringreduce.transports import wait_all

EXIT_TAG = 1


class ExitNotices:
    def __init__(self, comm):
        self.comm = comm
        self.exited = {}  # rank -> number of collectives it completed before leaving

    def poll(self):
        """Collect the notices that have arrived; return the ranks that have left so far."""
        status = MPI.Status()
        while self.comm.Iprobe(MPI.ANY_SOURCE, EXIT_TAG, status):
            self._receive(status.Get_source())
        return self.exited

    def announce_and_collect(self, completed):
        """Tell every other rank this one is leaving, and wait until every other rank has too."""
        notice = np.array([completed], dtype=np.int64)
        others = [r for r in range(self.comm.size) if r != self.comm.rank]
        sends = [self.comm.Isend(notice, r, EXIT_TAG) for r in others]
        for rank in others:
            if rank not in self.exited:
                self._receive(rank)
        wait_all(sends)

    def _receive(self, rank):
        notice = np.empty(1, dtype=np.int64)
        wait_all([self.comm.Irecv(notice, rank, EXIT_TAG)])
        self.exited[rank] = int(notice[0])
