"""The choice among the algorithm families: which one runs each collective at each size, from
RINGREDUCE_ALGORITHM, RINGREDUCE_HIERARCHICAL, the topology and the cost model, and the families
built on this job's communicators.
"""

import bisect

from ringreduce.algorithms import cost
from ringreduce.algorithms.device import CudaAwareMpi, CupyApi, Nccl, Staged
from ringreduce.algorithms.families import HalvingDoublingFamily, RingFamily, TreeFamily
from ringreduce.algorithms.mpi_native import MPIAlgorithms
from ringreduce.algorithms.rank_order import RankOrderFamily
from ringreduce.algorithms.shared_memory import SharedMemory
from ringreduce.errors import RingReduceError
from ringreduce.machine import gpu
from ringreduce.machine.segment import Segment
from ringreduce.machine.transport import MPITransport
from ringreduce.numerics import reduction

# MPI's own allreduces below this size run as persistent ones (mpi_native.py): there the call
# itself is what costs.
PERSISTENT_BELOW = 64 << 10

COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "alltoall")


class AlgorithmSelector:
    """The host families' calls (contract.HostFamily), each handed to the family that `tables`
    names for that collective and size."""

    def __init__(self, tables, families, segment=None, any_dtype=None, rank_order=None):
        """`tables`: collective -> [(from_bytes, family name), ...] in increasing sizes, the first
        from 0. `any_dtype` reduces the dtypes MPI has no datatype for (bfloat16), where the family
        picked cannot. `rank_order` (RINGREDUCE_DETERMINISTIC) runs the reductions whose bits
        depend on the order of addition where the family picked does not add in rank order."""
        self.tables, self.rank_order = tables, rank_order
        self._starts = {c: [start for start, _ in rows] for c, rows in tables.items()}
        self._chosen = {c: [families[name] for _, name in rows] for c, rows in tables.items()}
        self.families, self.segment, self.any_dtype = families, segment, any_dtype

    def _pick(self, collective, nbytes):
        return self._chosen[collective][bisect.bisect_right(self._starts[collective], nbytes) - 1]

    def _reducer(self, collective, buf, op):
        family = self._pick(collective, buf.nbytes)
        if self.rank_order is not None and not family.adds_in_rank_order and reduction.order_sensitive(op, buf.dtype):
            return self.rank_order
        return family if family.reduces_any_dtype or buf.dtype.kind != "V" else self.any_dtype

    def allreduce(self, buf, op, source=None, scale_result=None):
        self._reducer("allreduce", buf, op).allreduce(buf, op, source, scale_result)

    def reads_concatenation_at(self, nbytes):
        """Does the family that runs an allreduce of `nbytes` read a fused group where it lies?"""
        family = self._pick("allreduce", nbytes)
        return family.reads_concatenation and (self.rank_order is None or family.adds_in_rank_order)

    def reducescatter(self, buf, offsets, op, source=None):
        return self._reducer("reducescatter", buf, op).reducescatter(buf, offsets, op, source)

    def allgather(self, buf, offsets):
        self._pick("allgather", buf.nbytes).allgather(buf, offsets)

    def broadcast(self, buf, root, source=None):
        self._pick("broadcast", buf.nbytes).broadcast(buf, root, source)

    def alltoallv(self, send, send_offsets, recv, recv_offsets):
        self._pick("alltoall", send.nbytes).alltoallv(send, send_offsets, recv, recv_offsets)

    def close(self):
        self.families["mpi"].close()
        if self.segment is not None:
            self.segment.close()


def plan(config, topology, profile=cost.DEFAULT):
    """Which family runs each collective from which size: collective -> [(from_bytes, family), ...].

    auto: the cheapest the cost model predicts from `profile` for this topology (alltoall: pairwise
    exchange over the ring family's transport). Forced (RINGREDUCE_ALGORITHM): that family for
    every collective, except shm, which on one host leaves alltoall to the ring and across hosts
    is the hierarchical allreduce (unless RINGREDUCE_HIERARCHICAL=0, or the hosts run different
    numbers of ranks, or one each) with the ring for the rest.
    """
    if topology.size == 1:
        return dict.fromkeys(COLLECTIVES, [(0, "ring")])
    if config.hierarchical and not topology.homogeneous:
        raise RingReduceError("RINGREDUCE_HIERARCHICAL=1 needs the same number of ranks on every host; "
                              f"this job's hosts run different numbers (this one {topology.local_size})")
    if config.algorithm == "auto":
        model = cost.Model(profile, cost.JobShape(topology.size, topology.hosts, topology.homogeneous))
        return {**{c: model.table(c, config.hierarchical) for c in cost.COLLECTIVES}, "alltoall": [(0, "ring")]}
    if config.algorithm != "shm":
        return dict.fromkeys(COLLECTIVES, [(0, config.algorithm)])
    if topology.hosts == 1:
        return {**dict.fromkeys(COLLECTIVES, [(0, "shm")]), "alltoall": [(0, "ring")]}
    hierarchical = config.hierarchical or (
        config.hierarchical is None and topology.homogeneous and topology.local_size > 1)
    return {**dict.fromkeys(COLLECTIVES, [(0, "ring")]), "allreduce": [(0, "hierarchical" if hierarchical else "ring")]}


def select(config, topology, comm, host_comm, cross_comm, profile=cost.DEFAULT):
    """The algorithms that plan() names, built on this job's communicators."""
    tables = plan(config, topology, profile)
    named = {name for rows in tables.values() for _, name in rows}
    transport = MPITransport(comm)
    families = {"mpi": MPIAlgorithms(transport, persistent_below=PERSISTENT_BELOW),
                "ring": RingFamily(transport, config.pipeline_chunk_bytes),
                "halving_doubling": HalvingDoublingFamily(transport, config.pipeline_chunk_bytes),
                "tree": TreeFamily(transport, config.pipeline_chunk_bytes)}
    segment = None
    if {"shm", "hierarchical"} & named:
        segment = Segment(host_comm, topology.local_size * config.shared_memory_piece_bytes)
        families["shm"] = SharedMemory(segment)
        cross = RingFamily(MPITransport(cross_comm), config.pipeline_chunk_bytes)
        families["hierarchical"] = SharedMemory(segment, cross.allreduce)
    rank_order = RankOrderFamily(transport) if config.deterministic else None
    return AlgorithmSelector(tables, families, segment, families["ring"], rank_order)


def device_family(transport, host, comm, config):
    """A builder of the transport for CuPy arrays that gpu.choose_transport named; the device
    executor calls it at the first device request, on that request's GPU."""

    def build():
        cupy = gpu.require_cupy()
        api = CupyApi(cupy)
        staged = Staged(api, host, comm.rank, config.pipeline_chunk_bytes)
        if transport == "mpi":
            return CudaAwareMpi(MPITransport(comm), staged, config.deterministic)
        return Nccl(cupy, gpu.nccl_module(), comm, staged, config.deterministic) if transport == "nccl" else staged

    return build
