"""The families built on point-to-point messages over MPI: the ring, recursive halving and
doubling, and the binomial tree. They share the transport and every collective but the ones
each is for: the ring's reduce-scatter, the tree's broadcast and the pairwise alltoall."""

import numpy as np

from ringreduce.algorithms import halving, pairwise, ring, tree
from ringreduce.machine.memory import Workspace
from ringreduce.numerics import reduction


class RingFamily:
    """Reduce-scatter, allgather and allreduce on the ring, broadcast down a binomial tree,
    alltoall by pairwise exchange."""

    reads_concatenation = False
    reduces_any_dtype = True
    adds_in_rank_order = False  # an element's order depends on where it lies in the ring

    def __init__(self, transport, chunk_bytes):
        self.transport = transport
        self.workspace = Workspace()
        self.chunk_bytes = chunk_bytes

    def _chunk(self, buf):
        return max(1, self.chunk_bytes // buf.dtype.itemsize)

    def _reduce_everywhere(self, buf, combine, scale_result):
        scratch = self.workspace.get(len(buf) // self.transport.size + 1, buf.dtype)
        ring.allreduce(self.transport, buf, combine, scratch, self._chunk(buf), scale_result)

    def allreduce(self, buf, op, source=None, scale_result=None):
        if source is not None:
            buf[:] = source
        self._reduce_everywhere(buf, reduction.ufunc(op, buf.dtype), scale_result)

    def reducescatter(self, buf, offsets, op, source=None):
        if source is not None:
            buf[:] = source
        scratch = self.workspace.get(int(np.max(np.diff(offsets))), buf.dtype)
        ring.reduce_scatter(self.transport, buf, offsets, reduction.ufunc(op, buf.dtype), scratch, self._chunk(buf))
        rank = self.transport.rank
        return buf[offsets[rank]:offsets[rank + 1]]

    def allgather(self, buf, offsets):
        ring.allgather(self.transport, buf, offsets)

    def broadcast(self, buf, root, source=None):
        if source is not None:
            buf[:] = source
        tree.broadcast(self.transport, buf, root, self._chunk(buf))

    def alltoallv(self, send, send_offsets, recv, recv_offsets):
        pairwise.alltoallv(self.transport, send, send_offsets, recv, recv_offsets)


class HalvingDoublingFamily(RingFamily):
    """Allreduce by recursive halving and doubling, allgather by recursive doubling: log2(n)
    messages each way instead of the ring's n-1, for the same bytes."""

    def _reduce_everywhere(self, buf, combine, scale_result):
        scratch = self.workspace.get(len(buf), buf.dtype)
        halving.allreduce(self.transport, buf, combine, scratch, self._chunk(buf), scale_result)

    def allgather(self, buf, offsets):
        halving.allgather(self.transport, buf, offsets)


class TreeFamily(RingFamily):
    """Allreduce as a reduce up a binomial tree and a broadcast down it: 2 log2(n) messages of
    the whole array, for small arrays whose cost is the number of rounds."""

    def _reduce_everywhere(self, buf, combine, scale_result):
        t = self.transport
        scratch = self.workspace.get(max(1, len(buf) * tree.children_of(t.rank, t.size)), buf.dtype)
        tree.allreduce(t, buf, combine, scratch, self._chunk(buf), scale_result)
