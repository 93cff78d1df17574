"""The choice among the algorithm families: which one runs each collective at each size, from
RINGREDUCE_ALGORITHM, RINGREDUCE_HIERARCHICAL and the topology, and the families built on this
job's communicators.
"""

from ringreduce.algorithms.device import CudaAwareMpi, CupyApi, Nccl, Staged
from ringreduce.algorithms.mpi_native import MPIAlgorithms
from ringreduce.algorithms.ring import RingFamily
from ringreduce.algorithms.shared import SharedMemory
from ringreduce.errors import RingReduceError
from ringreduce.machine import gpu
from ringreduce.machine.shared_memory import Segment
from ringreduce.machine.transport import MPITransport

# Below this size "auto" uses the MPI library's own collectives: what costs there is latency,
# and MPI's C code has less of it than a Python loop over pieces (where they cross is measured
# in docs/performance.md).
SMALL_BYTES = 64 << 10


COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "alltoall")


class AlgorithmSelector:
    """The host families' calls (contract.HostFamily), each handed to the family for that
    collective and size: MPI's own below `small_bytes`, else the family `plan` named for it."""

    def __init__(self, families, small, small_bytes=0, segment=None, any_dtype=None):
        """`any_dtype` reduces the dtypes MPI has no datatype for (bfloat16), where the family
        picked cannot."""
        self.families, self.small, self.small_bytes = families, small, small_bytes
        self.segment, self.any_dtype = segment, any_dtype

    def _pick(self, collective, nbytes):
        return self.small if nbytes < self.small_bytes else self.families[collective]

    def _reducer(self, collective, buf):
        family = self._pick(collective, buf.nbytes)
        return family if family.reduces_any_dtype or buf.dtype.kind != "V" else self.any_dtype

    def allreduce(self, buf, op, source=None, scale_result=None):
        self._reducer("allreduce", buf).allreduce(buf, op, source, scale_result)

    def reads_concatenation_at(self, nbytes):
        """Does the family that runs an allreduce of `nbytes` read a fused group where it lies?"""
        return self._pick("allreduce", nbytes).reads_concatenation

    def reducescatter(self, buf, offsets, op, source=None):
        return self._reducer("reducescatter", buf).reducescatter(buf, offsets, op, source)

    def allgather(self, buf, offsets):
        self._pick("allgather", buf.nbytes).allgather(buf, offsets)

    def broadcast(self, buf, root, source=None):
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
    two copies, and there is nothing to reduce on the way).
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
    families = {"mpi": MPIAlgorithms(MPITransport(comm), persistent_below=SMALL_BYTES),
                "ring": RingFamily(MPITransport(comm), config.pipeline_chunk_bytes)}
    segment = None
    if {"shm", "hierarchical"} & set(chosen.values()):
        segment = Segment(host_comm, topology.local_size * config.shared_memory_piece_bytes)
        families["shm"] = SharedMemory(segment)
        cross = RingFamily(MPITransport(cross_comm), config.pipeline_chunk_bytes)
        families["hierarchical"] = SharedMemory(segment, cross.allreduce)
    return AlgorithmSelector({c: families[chosen[c]] for c in COLLECTIVES}, families["mpi"], chosen["small_bytes"],
                             segment, families["ring"])


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
