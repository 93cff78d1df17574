"""torchrun's conventions under rrun: the variables torchrun gives each rank (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE) and the rendezvous point
(MASTER_ADDR, MASTER_PORT), so that a script written for `torchrun --nproc-per-node=N` runs
unchanged under `rrun -np N`, with any torch.distributed backend. A variable the user set is
left as it is."""

import os
import random
import socket

from ringreduce.launcher.link import advertised_host

# rrun's placement, for each rank's wrapper: how many ranks each host takes, in order.
HOST_SLOTS_VARIABLE = "RRUN_HOST_SLOTS"
# Where the kernel keeps the ports it hands out to `bind(0)` and to outgoing connections.
EPHEMERAL_PORTS = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_MASTER_PORT = 20000

# Where Open MPI, MPICH's Hydra and Slurm put a rank's place on its host, and the number there.
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def rendezvous(placement: list[tuple[str, int]] | None, environ: os._Environ | dict) -> dict[str, str]:
    """What rrun adds to the job's environment: MASTER_ADDR, rank 0's host as the other hosts reach
    it (loopback on one host), and MASTER_PORT, a port free on this host when rank 0 runs here (a
    port this host has free is taken as free on another)."""
    added = {HOST_SLOTS_VARIABLE: ",".join(str(slots) for _, slots in placement)} if placement else {}
    hosts = [host for host, _ in placement or []]
    if "MASTER_ADDR" not in environ:
        here = {"localhost", socket.gethostname(), socket.getfqdn()}
        first = hosts[0] if hosts else "localhost"
        added["MASTER_ADDR"] = advertised_host(hosts) if first in here or first.startswith("127.") else first
    if "MASTER_PORT" not in environ:
        added["MASTER_PORT"] = str(free_master_port())
    return added


def free_master_port() -> int:
    """A port free now and below the kernel's ephemeral range: a port from that range, free when
    rrun looks, can be any process's outgoing connection by the time rank 0 listens on it (the
    MPI's own connections, made meanwhile, draw from it), and torch's store then fails with
    EADDRINUSE."""
    try:
        with open(EPHEMERAL_PORTS) as ports:
            ephemeral_start = int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_start = 32768
    candidates = list(range(LOWEST_MASTER_PORT, max(ephemeral_start, LOWEST_MASTER_PORT + 1)))
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:  # every port tried is taken: the kernel's choice, as torchrun makes it
        probe.bind(("", 0))
        return probe.getsockname()[1]


def rank_environment(environ: os._Environ | dict, world_size: int, rank: int) -> dict[str, str]:
    """torchrun's variables for `rank`: its host's index and size from rrun's placement, else
    from Slurm's, else one host; its place on the host from the MPI's variables."""
    slots = [int(s) for s in environ.get(HOST_SLOTS_VARIABLE, "").split(",") if s]
    if slots:
        starts = [sum(slots[:i]) for i in range(len(slots))]
        group_rank = max(i for i, start in enumerate(starts) if start <= rank)
        group_world_size, local_size = len(slots), slots[group_rank]
        local_rank = rank - starts[group_rank]
    else:
        group_rank = int(environ.get("SLURM_NODEID", 0))
        group_world_size = int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", 1)))
        local_size, local_rank = world_size // group_world_size, rank % max(world_size // group_world_size, 1)
    local_rank = int(next((environ[v] for v in LOCAL_RANK_VARIABLES if v in environ), local_rank))
    local_size = int(next((environ[v] for v in LOCAL_SIZE_VARIABLES if v in environ), local_size))
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_size), "GROUP_RANK": str(group_rank),
            "GROUP_WORLD_SIZE": str(group_world_size)}
