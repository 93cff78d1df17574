"""Where this process sits: its rank in the world, on its node, and across nodes."""

import dataclasses

from mpi4py import MPI


@dataclasses.dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def discover(comm):
    """Read the topology off `comm`: a node is the set of ranks that can share memory."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    cross = comm.Split(color=local.rank, key=comm.rank)
    try:
        return Topology(
            rank=comm.rank, size=comm.size,
            local_rank=local.rank, local_size=local.size,
            cross_rank=cross.rank, cross_size=cross.size,
        )
    finally:
        local.Free()
        cross.Free()
