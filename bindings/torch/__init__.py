"""ringreduce for PyTorch: the collectives on tensors, and data-parallel training in two lines.

    import ringreduce.torch as rr
    rr.init()
    optimizer = rr.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    rr.broadcast_parameters(model.state_dict(), root_rank=0)
"""

from ringreduce import (  # noqa: F401 - the core API, re-exported as Horovod's bindings do
    Average,
    Compression,
    Max,
    Min,
    MismatchError,
    NotInitializedError,
    PeerExitedError,
    Product,
    ReduceOp,
    RingReduceError,
    StallError,
    Sum,
    UnsupportedDtypeError,
)
from ringreduce.collectives import barrier, join  # noqa: F401
from ringreduce.objects import allgather_object, broadcast_object  # noqa: F401
from ringreduce.runtime import engine_stats, init, is_initialized, shutdown, straggler_report  # noqa: F401
from ringreduce.topology_api import cross_rank, cross_size, local_rank, local_size, rank, size  # noqa: F401
from ringreduce.torch import checkpoint  # noqa: F401
from ringreduce.torch.functions import broadcast_optimizer_state, broadcast_parameters  # noqa: F401
from ringreduce.torch.optimizer import DistributedOptimizer  # noqa: F401
from ringreduce.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from ringreduce.torch.tensors import (  # noqa: F401
    allgather,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allreduce,
    poll,
    reducescatter,
    synchronize,
)
