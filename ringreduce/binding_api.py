"""The part of the API that has nothing to do with tensors, which every framework binding
(ringreduce.torch, ringreduce.tensorflow) re-exports as it is, as Horovod's bindings do:
`from ringreduce.binding_api import *`."""

from ringreduce.collectives import barrier, join
from ringreduce.compression import Compression
from ringreduce.errors import (
    MismatchError,
    NotInitializedError,
    PeerExitedError,
    RingReduceError,
    StallError,
    UnsupportedDtypeError,
)
from ringreduce.objects import allgather_object, broadcast_object
from ringreduce.ops import Average, Max, Min, Product, ReduceOp, Sum
from ringreduce.runtime import engine_stats, init, is_initialized, shutdown, straggler_report
from ringreduce.topology_api import cross_rank, cross_size, local_rank, local_size, rank, size

__all__ = [
    "Average", "Compression", "Max", "Min", "MismatchError", "NotInitializedError", "PeerExitedError", "Product",
    "ReduceOp", "RingReduceError", "StallError", "Sum", "UnsupportedDtypeError", "allgather_object", "barrier",
    "broadcast_object", "cross_rank", "cross_size", "engine_stats", "init", "is_initialized", "join", "local_rank",
    "local_size", "rank", "shutdown", "size", "straggler_report",
]
