"""torch.distributed on gloo in the ranks rrun started, for the benchmarks' comparisons."""

import socket

import torch.distributed as dist

import ringreduce as rr


def start_gloo(rank, size):
    """Join a gloo process group whose address rank 0 chooses and broadcasts."""
    if rank == 0:
        host = "127.0.0.1" if rr.local_size() == size else socket.gethostbyname(socket.gethostname())
        with socket.socket() as probe:
            probe.bind((host, 0))
            address = (host, probe.getsockname()[1])
    address = rr.broadcast_object(address if rank == 0 else None, root_rank=0)
    dist.init_process_group("gloo", init_method=f"tcp://{address[0]}:{address[1]}", rank=rank, world_size=size)
