"""The collective algorithms, chosen once at init by RINGREDUCE_ALGORITHM.

Both families take flat contiguous arrays and element offsets and work in place; the
layer above handles shapes, dtypes, scaling and copies.
"""

import numpy as np

from ringreduce import ops
from ringreduce.algorithms import pairwise, ring, tree
from ringreduce.algorithms.mpi_native import MPIAlgorithms


class RingAlgorithms:
    """ringreduce's own algorithms over a point-to-point transport."""

    def __init__(self, transport, workspace, chunk_bytes):
        self.transport = transport
        self.workspace = workspace
        self.chunk_bytes = chunk_bytes

    def _chunk(self, buf):
        return max(1, self.chunk_bytes // buf.dtype.itemsize)

    def allreduce(self, buf, op):
        scratch = self.workspace.get(len(buf) // self.transport.size + 1, buf.dtype)
        ring.allreduce(self.transport, buf, ops.ufunc(op), scratch, self._chunk(buf))

    def reducescatter(self, buf, offsets, op):
        scratch = self.workspace.get(int(np.max(np.diff(offsets))), buf.dtype)
        ring.reduce_scatter(self.transport, buf, offsets, ops.ufunc(op), scratch, self._chunk(buf))
        rank = self.transport.rank
        return buf[offsets[rank]:offsets[rank + 1]].copy()

    def allgather(self, buf, offsets):
        ring.allgather(self.transport, buf, offsets)

    def broadcast(self, buf, root):
        tree.broadcast(self.transport, buf, root, self._chunk(buf))

    def alltoallv(self, send, send_offsets, recv, recv_offsets):
        pairwise.alltoallv(self.transport, send, send_offsets, recv, recv_offsets)


def select(config, transport, workspace):
    if config.algorithm == "mpi":
        return MPIAlgorithms(transport)
    return RingAlgorithms(transport, workspace, config.pipeline_chunk_bytes)
