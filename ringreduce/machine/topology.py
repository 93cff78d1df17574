"""Where this process sits: its rank in the world, on its host, and across hosts."""

import dataclasses

from mpi4py import MPI

from ringreduce.machine.layout import even_counts, offsets_of


@dataclasses.dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hosts: int = 1
    # Every host runs the same number of ranks (what the hierarchical allreduce needs).
    homogeneous: bool = True


def discover(comm, simulated_hosts=None):
    """The topology of `comm`, with its host communicator (ranks that share memory) and its cross
    communicator (the ranks of the same local rank on every host).

    `simulated_hosts=N` splits the ranks further into N consecutive groups that act as separate
    hosts, so that the cross-host code paths run on one machine (for tests).
    """
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    if simulated_hosts:
        starts = offsets_of(even_counts(comm.size, min(simulated_hosts, comm.size)))
        host = sum(start <= comm.rank for start in starts[1:-1])
        shared = local
        local = shared.Split(color=host, key=comm.rank)
        shared.Free()
    cross = comm.Split(color=local.rank, key=comm.rank)
    places = comm.allgather((local.rank, local.size))
    topology = Topology(
        rank=comm.rank, size=comm.size,
        local_rank=local.rank, local_size=local.size,
        cross_rank=cross.rank, cross_size=cross.size,
        hosts=sum(local_rank == 0 for local_rank, _ in places),
        homogeneous=len({size for _, size in places}) == 1,
    )
    return topology, local, cross
