"""ringreduce for PyTorch: the collectives on tensors, and data-parallel training in two lines.

    import ringreduce.torch as rr
    rr.init()
    optimizer = rr.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    rr.broadcast_parameters(model.state_dict(), root_rank=0)
"""

import ringreduce
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
    reducescatter,
)

globals().update((name, getattr(ringreduce, name)) for name in ringreduce.WITHOUT_ARRAYS)
