"""ringreduce for PyTorch, with the names, arguments and defaults of horovod.torch: the
collectives on tensors, and data-parallel training in two lines.

    import ringreduce.torch as rr
    rr.init()
    optimizer = rr.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    rr.broadcast_parameters(model.state_dict(), root_rank=0)
"""

import ringreduce
import torch
from ringreduce import config
from ringreduce.numerics.kernels import lend
from ringreduce.torch import checkpoint, elastic, process_group  # noqa: F401
from ringreduce.torch.compression import Compression  # noqa: F401
from ringreduce.torch.differentiable import (  # noqa: F401
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from ringreduce.torch.functions import broadcast_optimizer_state, broadcast_parameters  # noqa: F401
from ringreduce.torch.kernels import TorchKernels
from ringreduce.torch.local_sgd import (  # noqa: F401
    HierarchicalModelAverager,
    PeriodicModelAverager,
    PostLocalSGDOptimizer,
)
from ringreduce.torch.optimizer import DistributedOptimizer  # noqa: F401
from ringreduce.torch.parallel import ColumnParallelLinear, RowParallelLinear  # noqa: F401
from ringreduce.torch.pipeline import GPipe  # noqa: F401
from ringreduce.torch.point_to_point import irecv, isend, recv, send  # noqa: F401
from ringreduce.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from ringreduce.torch.tensors import (  # noqa: F401
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    reducescatter_async,
)
from ringreduce.training.powersgd import PowerSGD  # noqa: F401

globals().update((name, getattr(ringreduce, name)) for name in ringreduce.WITHOUT_ARRAYS)
# torch.use_deterministic_algorithms(True) before init asks for reductions in rank order too
# (RINGREDUCE_DETERMINISTIC, where set, decides).
config.lend_default("deterministic", torch.are_deterministic_algorithms_enabled)
lend(TorchKernels())  # the casts and sums of fp16 and bf16 on the wire, 2-7x faster than numpy's
if torch.distributed.is_available():
    process_group.register()  # dist.init_process_group("ringreduce")
