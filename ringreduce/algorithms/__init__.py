"""The collective algorithms, and the choice among them that RINGREDUCE_ALGORITHM makes.

Every family takes flat contiguous arrays and element offsets and works in place (allreduce
and reducescatter may also read this rank's contribution from a separate `source`, and
broadcast the root's values, which saves a copy of them; reducescatter returns this rank's
segment, which may be a view of `buf`); the layer above handles shapes, dtypes, scaling and
copies. An allreduce's `finish` (Average's division, the postscale) runs in place on each
stretch of the result once it is reduced and before it is passed on: by one rank, on its share,
where that share is still in the cache, instead of by every rank in one more pass over the whole
result. The device families (device.py) do the same on CuPy buffers.
"""

import numpy as np

from ringreduce import gpu, ops
from ringreduce.algorithms import pairwise, ring, tree
from ringreduce.algorithms.device import CudaAwareMpi, CupyApi, Nccl, Staged
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

    def allreduce(self, buf, op, source=None, finish=None):
        if source is not None:
            buf[:] = source
        scratch = self.workspace.get(len(buf) // self.transport.size + 1, buf.dtype)
        ring.allreduce(self.transport, buf, ops.ufunc(op), scratch, self._chunk(buf), finish)

    def reducescatter(self, buf, offsets, op, source=None):
        if source is not None:
            buf[:] = source
        scratch = self.workspace.get(int(np.max(np.diff(offsets))), buf.dtype)
        ring.reduce_scatter(self.transport, buf, offsets, ops.ufunc(op), scratch, self._chunk(buf))
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


COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "alltoall")


class Chosen:
    """Per call, the algorithm family for that collective and size: MPI's own below `small_bytes`,
    else the family `plan` named for the collective."""

    def __init__(self, families, small, small_bytes=0, segment=None):
        self.families, self.small, self.small_bytes = families, small, small_bytes
        self.segment = segment

    def _pick(self, collective, nbytes):
        return self.small if nbytes < self.small_bytes else self.families[collective]

    def allreduce(self, buf, op, source=None, finish=None):
        """Reduce in place, or from `source` (this rank's contribution, same length and dtype) into
        `buf`; then `finish` in place on the result, if given."""
        self._pick("allreduce", buf.nbytes).allreduce(buf, op, source, finish)

    def reads_concatenation(self, nbytes):
        """Does the allreduce of `nbytes` take its `source` and its `buf` as arrays.Concatenations
        (pieces read and written where they lie) rather than arrays? Only the shared-memory family
        does."""
        return isinstance(self._pick("allreduce", nbytes), SharedMemory)

    def reducescatter(self, buf, offsets, op, source=None):
        """This rank's segment of the reduction of every rank's `buf` (or `source`, into `buf`)."""
        return self._pick("reducescatter", buf.nbytes).reducescatter(buf, offsets, op, source)

    def allgather(self, buf, offsets):
        self._pick("allgather", buf.nbytes).allgather(buf, offsets)

    def broadcast(self, buf, root, source=None):
        """`buf` on every rank gets the root's values: its `buf`, or its `source` if it passes one."""
        self._pick("broadcast", buf.nbytes).broadcast(buf, root, source)

    def alltoallv(self, send, send_offsets, recv, recv_offsets):
        self.families["alltoall"].alltoallv(send, send_offsets, recv, recv_offsets)

    def close(self):
        self.small.close()
        if self.segment is not None:
            self.segment.close()


def plan(config, topology):
    """Which family runs each collective ("ring", "shm", "hierarchical" or "mpi"), and below what
    size MPI's own runs instead ("small_bytes"), from RINGREDUCE_ALGORITHM, RINGREDUCE_HIERARCHICAL
    and the topology.

    auto, on one host: shared memory for the reductions and broadcast; the ring for allgather,
    whose transfers MPI makes single kernel copies between processes (a shared segment needs
    two copies, and there is nothing to reduce on the way): 18 ms against 28 ms at 64 MiB.
    Across hosts: the hierarchical allreduce (unless RINGREDUCE_HIERARCHICAL=0, or the hosts run
    different numbers of ranks, or one each), the ring for the rest. Below SMALL_BYTES, MPI's own.
    shm: shared memory wherever it can run, at every size. ring and mpi: that family for all.
    """
    if config.algorithm in ("mpi", "ring") or topology.size == 1:
        family = "ring" if topology.size == 1 else config.algorithm
        return {**dict.fromkeys(COLLECTIVES, family), "small_bytes": 0}
    small_bytes = SMALL_BYTES if config.algorithm == "auto" else 0
    if topology.hosts == 1:
        allgather = "ring" if config.algorithm == "auto" else "shm"
        return {"allreduce": "shm", "reducescatter": "shm", "allgather": allgather, "broadcast": "shm",
                "alltoall": "ring", "small_bytes": small_bytes}
    if config.hierarchical and not topology.homogeneous:
        raise RingReduceError("RINGREDUCE_HIERARCHICAL=1 needs the same number of ranks on every host; "
                              f"this job's hosts run different numbers (this one {topology.local_size})")
    hierarchical = config.hierarchical or (
        config.hierarchical is None and topology.homogeneous and topology.local_size > 1)
    return {**dict.fromkeys(COLLECTIVES, "ring"), "allreduce": "hierarchical" if hierarchical else "ring",
            "small_bytes": small_bytes}


def select(config, topology, comm, host_comm, cross_comm):
    """The algorithms that plan() names, built on this job's communicators."""
    chosen = plan(config, topology)
    families = {"mpi": MPIAlgorithms(MPITransport(comm), repeat_below=SMALL_BYTES),
                "ring": RingAlgorithms(MPITransport(comm), config.pipeline_chunk_bytes)}
    segment = None
    if {"shm", "hierarchical"} & set(chosen.values()):
        segment = Segment(host_comm, topology.local_size * config.shared_memory_piece_bytes)
        families["shm"] = SharedMemory(segment)
        cross = RingAlgorithms(MPITransport(cross_comm), config.pipeline_chunk_bytes)
        families["hierarchical"] = SharedMemory(segment, cross.allreduce)
    return Chosen({c: families[chosen[c]] for c in COLLECTIVES}, families["mpi"], chosen["small_bytes"], segment)


def device_family(transport, host, comm, config):
    """A builder of the transport for CuPy arrays that gpu.choose_transport named; the device
    executor calls it at the first device request, on that request's GPU."""

    def build():
        cupy = gpu.require_cupy()
        api = CupyApi(cupy)
        if transport == "mpi":
            return CudaAwareMpi(MPITransport(comm), api.stream())
        staged = Staged(api, host, comm.rank, config.pipeline_chunk_bytes)
        return Nccl(cupy, gpu.nccl_module(), comm, staged) if transport == "nccl" else staged

    return build
