"""ringreduce: collective communication for distributed training, over MPI.

    import ringreduce as rr
    rr.init()
    total = rr.allreduce(array, op=rr.Sum)

The public names are listed here, once. Those of modules that start MPI load on first use:
importing mpi4py.MPI starts MPI, and rrun and its per-rank wrapper import this package
without becoming MPI processes themselves.
"""

import importlib
import typing

# Re-exported: _EAGER below lists them (numpy-free: rrun and its per-rank wrapper import this
# package, and numpy's import took half of their start, 80 ms of 160).
from ringreduce.errors import (  # noqa: F401
    CorruptCheckpointError,
    DeadlockError,
    GpuError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    MismatchError,
    NotInitializedError,
    PeerExitedError,
    RingReduceError,
    StallError,
    UnsafeFileError,
    UnsupportedDtypeError,
)
from ringreduce.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum  # noqa: F401

__version__ = "0.1.0"

_EAGER = (
    "Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum", "CorruptCheckpointError", "DeadlockError",
    "GpuError", "HorovodInternalError", "HostsUpdatedInterrupt", "MismatchError", "NotInitializedError",
    "PeerExitedError", "RingReduceError", "StallError", "UnsafeFileError", "UnsupportedDtypeError",
)
# module -> the public names it defines that take no arrays.
_LAZY_WITHOUT_ARRAYS = {
    "ringreduce.runtime": (
        "init", "shutdown", "is_initialized", "engine_stats", "straggler_report",
        "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "is_homogeneous",
        "mpi_threads_supported", "start_timeline", "stop_timeline",
    ),
    "ringreduce.build": (
        "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "cuda_built", "ddl_built",
        "ccl_built", "rocm_built",
    ),
    "ringreduce.collectives": ("barrier", "join", "poll", "synchronize", "stop_requested"),
    "ringreduce.objects": ("broadcast_object", "allgather_object"),
    "ringreduce.process_sets": ("ProcessSet", "global_process_set", "add_process_set", "remove_process_set"),
    "ringreduce.training.load_balancing": ("LoadBalancer", "BalancedBatchSampler"),
}
# Point-to-point transfers on arrays: core names; each framework binding has its own.
_POINT_TO_POINT = ("send", "recv", "isend", "irecv")
# The collectives on arrays: each framework binding has its own, on its tensors, and its own
# Compression, as Horovod's do.
_ARRAY_CALLS = (
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async",
)
_HOME = {name: module for module, names in _LAZY_WITHOUT_ARRAYS.items() for name in names}
_HOME.update(dict.fromkeys(_ARRAY_CALLS, "ringreduce.collectives"))
_HOME.update(dict.fromkeys(_POINT_TO_POINT, "ringreduce.point_to_point"))
_HOME["Compression"] = "ringreduce.numerics.compression"  # each framework binding has its own

# What every framework binding re-exports as it is (as Horovod's bindings do): the API that
# takes no arrays.
WITHOUT_ARRAYS = _EAGER + tuple(name for names in _LAZY_WITHOUT_ARRAYS.values() for name in names)

__all__ = sorted(_EAGER + tuple(_HOME))

if typing.TYPE_CHECKING:  # the names loaded on first use, for type checkers and editors
    from ringreduce.build import (  # noqa: F401
        ccl_built,
        cuda_built,
        ddl_built,
        gloo_built,
        gloo_enabled,
        mpi_built,
        mpi_enabled,
        nccl_built,
        rocm_built,
    )
    from ringreduce.collectives import (  # noqa: F401
        allgather,
        allgather_async,
        allreduce,
        allreduce_,
        allreduce_async,
        allreduce_async_,
        alltoall,
        alltoall_async,
        barrier,
        broadcast,
        broadcast_,
        broadcast_async,
        broadcast_async_,
        grouped_allgather,
        grouped_allgather_async,
        grouped_allreduce,
        grouped_allreduce_,
        grouped_allreduce_async,
        grouped_allreduce_async_,
        grouped_reducescatter,
        grouped_reducescatter_async,
        join,
        poll,
        reducescatter,
        reducescatter_async,
        stop_requested,
        synchronize,
    )
    from ringreduce.numerics.compression import Compression  # noqa: F401
    from ringreduce.objects import allgather_object, broadcast_object  # noqa: F401
    from ringreduce.point_to_point import irecv, isend, recv, send  # noqa: F401
    from ringreduce.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set  # noqa: F401
    from ringreduce.runtime import (  # noqa: F401
        cross_rank,
        cross_size,
        engine_stats,
        init,
        is_homogeneous,
        is_initialized,
        local_rank,
        local_size,
        mpi_threads_supported,
        rank,
        shutdown,
        size,
        start_timeline,
        stop_timeline,
        straggler_report,
    )
    from ringreduce.training.load_balancing import BalancedBatchSampler, LoadBalancer  # noqa: F401


def __getattr__(name):
    if name not in _HOME:
        raise AttributeError(f"module 'ringreduce' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))
