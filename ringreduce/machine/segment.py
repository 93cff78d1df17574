"""One shared-memory segment per host, mapped by every rank on it: the intra-node transport.

The segment is an MPI-3 shared window (so it works under any MPI and is freed with the job),
allocated once at init and reused by every collective. It holds a flag per rank, on its own
cache line, for synchronization, and two data areas that collectives use in turn: a rank can
fill the next area while the others still read the last one, so each use needs only the
barriers between its own writes and reads.
"""

import numpy as np
from mpi4py import MPI

from ringreduce.machine.transport import wait_until

CACHE_LINE = 64


class Segment:
    def __init__(self, comm, area_bytes):
        """`comm`: the ranks of one host (they must share memory). Collective over `comm`."""
        self.rank, self.size = comm.rank, comm.size
        self.area_bytes = area_bytes
        control = self.size * CACHE_LINE
        total = control + 2 * area_bytes
        self._window = MPI.Win.Allocate_shared(total if comm.rank == 0 else 0, 1, comm=comm)
        memory = np.frombuffer(self._window.Shared_query(0)[0], dtype=np.uint8)[:total]
        # A passive-target epoch for the whole life of the window, so that Win.Sync can order
        # this rank's plain loads and stores against the other ranks' (MPI's unified model).
        self._window.Lock_all(MPI.MODE_NOCHECK)
        if comm.rank == 0:
            memory.fill(0)
        comm.Barrier()
        memory[::4096].sum()  # map every page into this process now, not inside a collective
        # Each rank's flag, as Python reads it fastest: a barrier's wait tests them over and over,
        # and min() of a memoryview costs a tenth of numpy's min() of so few elements.
        self._flags = memoryview(memory[:control]).cast("q")[::CACHE_LINE // 8]
        self._areas = memory[control:].reshape(2, area_bytes)
        self._epoch = 0
        self._uses = 0

    def area(self, dtype, count):
        """The next data area (they alternate), as `count` elements of `dtype`."""
        area = self._areas[self._uses % 2]
        self._uses += 1
        return area[:count * np.dtype(dtype).itemsize].view(dtype)

    def barrier(self):
        """Return when every rank of the host has reached this barrier: what each wrote to the
        segment before it is then visible to all."""
        self._epoch += 1
        self._window.Sync()
        self._flags[self.rank] = self._epoch
        epoch, flags = self._epoch, self._flags
        wait_until(lambda: min(flags) >= epoch)
        self._window.Sync()

    def close(self):
        self._window.Unlock_all()
        self._window.Free()
