"""ringreduce: collective communication for distributed training, over MPI.

    import ringreduce as rr
    rr.init()
    total = rr.allreduce(array, op=rr.Sum)

The public names load on first use: importing mpi4py.MPI starts MPI, and rrun and its
per-rank wrapper import this package without becoming MPI processes themselves.
"""

import importlib

from ringreduce.compression import Compression
from ringreduce.errors import (
    MismatchError,
    NotInitializedError,
    PeerExitedError,
    RingReduceError,
    StallError,
    UnsupportedDtypeError,
)
from ringreduce.ops import Average, Max, Min, Product, ReduceOp, Sum

__version__ = "0.1.0"

_LAZY = {
    "ringreduce.runtime": ("init", "shutdown", "is_initialized", "engine_stats", "straggler_report"),
    "ringreduce.collectives": (
        "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
        "grouped_allreduce_async", "allgather", "allgather_async", "broadcast", "broadcast_",
        "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
        "reducescatter_async", "barrier", "join", "poll", "synchronize",
    ),
    "ringreduce.objects": ("broadcast_object", "allgather_object"),
    "ringreduce.topology_api": (
        "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    ),
}
_HOME = {name: module for module, names in _LAZY.items() for name in names}

__all__ = sorted(_HOME) + [
    "Compression", "Average", "Max", "Min", "Product", "ReduceOp", "Sum",
    "MismatchError", "NotInitializedError", "PeerExitedError", "RingReduceError", "StallError",
    "UnsupportedDtypeError",
]


def __getattr__(name):
    if name not in _HOME:
        raise AttributeError(f"module 'ringreduce' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))
