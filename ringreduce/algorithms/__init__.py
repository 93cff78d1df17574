"""The collective algorithms, and the choice among them that RINGREDUCE_ALGORITHM makes.

Every family takes flat contiguous arrays and element offsets and works in place; the layer
above handles shapes, dtypes, scaling and copies.
"""

import numpy as np

from ringreduce import ops
from ringreduce.algorithms import pairwise, ring, tree
from ringreduce.algorithms.mpi_native import MPIAlgorithms
from ringreduce.algorithms.shared import SharedMemory
from ringreduce.arrays import Workspace
from ringreduce.errors import RingReduceError
from ringreduce.shared_memory import Segment
from ringreduce.transports import MPITransport

# Below this size "auto" uses the MPI library's own collectives: what costs there is latency,
# and MPI's C code has less of it than a Python loop over pieces (measured: a 4 KiB allreduce
# at 2 ranks takes 12 us in MPI, 40 us through the shared segment; they cross near 64 KiB).
SMALL_BYTES = 64 << 10


class RingAlgorithms:
    """ringreduce's own algorithms over a point-to-point transport."""

    def __init__(self, transport, chunk_bytes):
        self.transport = transport
        self.workspace = Workspace()
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


class Chosen:
    """Per call, the algorithm family for that collective and size: `small` below `small_bytes`;
    above, `allreduce` for allreduce and `others` for reducescatter, allgather and broadcast."""

    def __init__(self, allreduce, others, alltoall, small=None, small_bytes=0, segment=None):
        self.alltoall_family = alltoall
        self.large_allreduce, self.large_others = allreduce, others
        self.small, self.small_bytes = small, small_bytes
        self.segment = segment

    def _pick(self, buf, large):
        return self.small if buf.nbytes < self.small_bytes else large

    def allreduce(self, buf, op):
        self._pick(buf, self.large_allreduce).allreduce(buf, op)

    def reducescatter(self, buf, offsets, op):
        return self._pick(buf, self.large_others).reducescatter(buf, offsets, op)

    def allgather(self, buf, offsets):
        self._pick(buf, self.large_others).allgather(buf, offsets)

    def broadcast(self, buf, root):
        self._pick(buf, self.large_others).broadcast(buf, root)

    def alltoallv(self, send, send_offsets, recv, recv_offsets):
        self.alltoall_family.alltoallv(send, send_offsets, recv, recv_offsets)

    def close(self):
        if self.segment is not None:
            self.segment.close()


def plan(config, topology):
    """Which family runs what, from RINGREDUCE_ALGORITHM, RINGREDUCE_HIERARCHICAL and the topology:
    {"allreduce", "others", "alltoall": "ring" | "shm" | "hierarchical" | "mpi", "small_bytes"}.

    auto: MPI's own below SMALL_BYTES; above, on one host, shared memory for every collective;
    across hosts, the hierarchical allreduce (unless RINGREDUCE_HIERARCHICAL=0, or hosts run
    different numbers of ranks, or one each) and the ring for the rest. shm: the same without
    the small-size exception. ring and mpi: that family for everything.
    """
    if config.algorithm in ("mpi", "ring"):
        return dict(allreduce=config.algorithm, others=config.algorithm, alltoall=config.algorithm, small_bytes=0)
    small_bytes = SMALL_BYTES if config.algorithm == "auto" else 0
    if topology.size == 1:
        return dict(allreduce="ring", others="ring", alltoall="ring", small_bytes=0)
    if topology.hosts == 1:
        return dict(allreduce="shm", others="shm", alltoall="ring", small_bytes=small_bytes)
    if config.hierarchical and not topology.homogeneous:
        raise RingReduceError("RINGREDUCE_HIERARCHICAL=1 needs the same number of ranks on every host; "
                              f"this job's hosts run different numbers (this one {topology.local_size})")
    hierarchical = config.hierarchical or (
        config.hierarchical is None and topology.homogeneous and topology.local_size > 1)
    return dict(allreduce="hierarchical" if hierarchical else "ring", others="ring", alltoall="ring",
                small_bytes=small_bytes)


def select(config, topology, comm, host_comm, cross_comm):
    """The algorithms that plan() names, built on this job's communicators."""
    chosen = plan(config, topology)
    families = {"mpi": MPIAlgorithms(MPITransport(comm)),
                "ring": RingAlgorithms(MPITransport(comm), config.pipeline_chunk_bytes)}
    segment = None
    if {"shm", "hierarchical"} & set(chosen.values()):
        segment = Segment(host_comm, topology.local_size * config.shared_memory_piece_bytes)
        families["shm"] = SharedMemory(segment)
        cross = RingAlgorithms(MPITransport(cross_comm), config.pipeline_chunk_bytes)
        families["hierarchical"] = SharedMemory(segment, cross.allreduce)
    return Chosen(families[chosen["allreduce"]], families[chosen["others"]], families[chosen["alltoall"]],
                  families["mpi"], chosen["small_bytes"], segment)
