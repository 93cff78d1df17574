"""The MPI library's own collectives behind the same interface as ringreduce's algorithms:
the baseline that RINGREDUCE_ALGORITHM=mpi selects and the benchmarks compare against.

They are started non-blocking and waited as ringreduce waits for its own messages (wait_all),
polled for longer before it sleeps (COLLECTIVE_YIELD_SECONDS), so a rank waiting in one neither
spins a core nor misses a partner that has left. Device buffers (a CUDA-aware MPI) go to the
blocking calls instead: Open MPI documents its nonblocking collectives as not CUDA-aware, while its
CUDA support query answers yes. Small allreduces, where the call
itself is what costs, run as persistent allreduces on buffers of their own, one per count, dtype
and op seen (the last PERSISTENT_KEPT of them), with the array copied in and out.
"""

import collections

import numpy as np
from mpi4py import MPI

from ringreduce.machine.backends import new_like, on_device
from ringreduce.machine.transport import COLLECTIVE_YIELD_SECONDS, PersistentAllreduce, wait_all
from ringreduce.ops import ReduceOp

PERSISTENT_KEPT = 32

_MPI_OPS = {
    ReduceOp.AVERAGE: MPI.SUM,
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.PRODUCT: MPI.PROD,
}


def _typed(buf):
    # MPI defines no MIN/MAX on C_BOOL; bools are 0/1 bytes, which uint8 reduces identically.
    return buf.view(np.uint8) if buf.dtype == np.bool_ else buf


def _run(comm, buf, name, *args):
    """Collective `name` (Allreduce, ...) of `buf`: its nonblocking form (Iallreduce, ...) started and
    waited for, or the blocking one for a device buffer."""
    if on_device(buf):
        getattr(comm, name)(*args)
    else:
        wait_all([getattr(comm, "I" + name[0].lower() + name[1:])(*args)], COLLECTIVE_YIELD_SECONDS)


class MPIAlgorithms:
    reads_concatenation = False
    reduces_any_dtype = False
    adds_in_rank_order = False  # the library's own order, which it does not promise

    def __init__(self, transport, persistent_below=0):
        """Allreduces of fewer than `persistent_below` bytes of host memory run as persistent ones:
        every rank calls these algorithms in the same order, so every rank sets up the same
        ones at the same call, as a persistent allreduce needs."""
        self.comm = transport.comm
        self.persistent_below = persistent_below
        self._persistent = collections.OrderedDict()  # (count, dtype, op) -> (PersistentAllreduce, buffer)

    def allreduce(self, buf, op, source=None, scale_result=None):
        persistent = self._persistent_for(_typed(buf), op) if buf.nbytes < self.persistent_below else None
        if persistent is None:
            send = MPI.IN_PLACE if source is None else _typed(source)
            _run(self.comm, buf, "Allreduce", send, _typed(buf), _MPI_OPS[op])
        else:
            run, fixed = persistent
            np.copyto(fixed, _typed(buf if source is None else source))
            run()
            np.copyto(_typed(buf), fixed)
        if scale_result is not None:
            scale_result(buf)

    def _persistent_for(self, buf, op):
        """The persistent allreduce, and its buffer, for arrays like `buf`; None where the library
        has no persistent collectives (a fresh call on the array itself then saves two copies)."""
        key = (len(buf), buf.dtype.str, op)
        entry = self._persistent.pop(key, None)
        if entry is None:
            fixed = np.empty(len(buf), buf.dtype)
            run = PersistentAllreduce(self.comm, MPI.IN_PLACE, fixed, _MPI_OPS[op], COLLECTIVE_YIELD_SECONDS)
            if not run.persistent:
                self.persistent_below = 0
                return None
            if len(self._persistent) == PERSISTENT_KEPT:
                self._persistent.popitem(last=False)[1][0].free()
            entry = (run, fixed)
        self._persistent[key] = entry  # the most recently used last
        return entry

    def close(self):
        for run, _ in self._persistent.values():
            run.free()
        self._persistent.clear()

    def reducescatter(self, buf, offsets, op, source=None):
        counts = np.diff(offsets).tolist()
        result = new_like(buf, (counts[self.comm.rank],))  # on the GPU for a CUDA-aware MPI's device buffers
        send = buf if source is None else source
        _run(self.comm, buf, "Reduce_scatter", _typed(send), _typed(result), counts, _MPI_OPS[op])
        return result

    def allgather(self, buf, offsets):
        itemsize = buf.dtype.itemsize
        counts = [c * itemsize for c in np.diff(offsets).tolist()]
        displacements = [o * itemsize for o in offsets[:-1]]
        spec = [buf, counts, displacements, MPI.BYTE]
        _run(self.comm, buf, "Allgatherv", MPI.IN_PLACE, spec)

    def broadcast(self, buf, root, source=None):
        if source is not None:
            buf[...] = source
        _run(self.comm, buf, "Bcast", [buf, MPI.BYTE], root)

    def alltoallv(self, send, send_offsets, recv, recv_offsets):
        itemsize = send.dtype.itemsize

        def spec(buf, offsets):
            counts = [c * itemsize for c in np.diff(offsets).tolist()]
            return [buf, counts, [o * itemsize for o in offsets[:-1]], MPI.BYTE]

        _run(self.comm, send, "Alltoallv", spec(send, send_offsets), spec(recv, recv_offsets))
