"""Tensor-parallel layers: a linear layer's weight split across the ranks of a process set, as in
Megatron-LM. ColumnParallelLinear splits the output features, RowParallelLinear the input
features; a column-parallel layer that keeps its output split followed by a row-parallel one
costs one allreduce forward and one backward.

The collectives inside are the tensor-parallel ones, not Horovod's: every rank of the set holds
the same loss (one model, split), so the gradient of a copied input is the sum of the ranks'
parts, and the gradient of a summed output goes to every part as it is. (Horovod's differentiable
allreduce instead gives the gradient of the sum of every rank's loss, as for data parallelism.)
"""

import torch
import torch.nn.functional as F
from ringreduce import ops
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.torch import tensors


class _SplitLinear(torch.nn.Module):
    """A Linear whose weight is split evenly across `process_set` along `split_dim` (0: the output
    features, 1: the input features), in set-rank order; the bias follows the output features."""

    def __init__(self, in_features: int, out_features: int, bias: bool, process_set: ProcessSet,
                 split_dim: int) -> None:
        super().__init__()
        self.process_set, self.split_dim = process_set, split_dim
        shape = [out_features, in_features]
        what = ("out_features", "in_features")[self.split_dim]
        shape[self.split_dim] = _part(shape[self.split_dim], process_set, what)
        self.weight = torch.nn.Parameter(torch.empty(shape))
        self.bias = torch.nn.Parameter(torch.zeros(shape[0])) if bias else None
        torch.nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, process_set: ProcessSet = global_process_set,
                    **options) -> "_SplitLinear":
        """This rank's part of an existing torch.nn.Linear (the same on every rank of the set)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, process_set, **options)
        with torch.no_grad():
            layer.weight.copy_(_mine(linear.weight, layer.split_dim, process_set))
            if linear.bias is not None and layer.bias is not None:
                layer.bias.copy_(_mine(linear.bias, 0, process_set) if layer.split_dim == 0 else linear.bias)
        return layer


class ColumnParallelLinear(_SplitLinear):
    """y = x W^T + b with the rows of W (the output features) split evenly across `process_set`:
    each rank holds out_features / size of them (and of b). With `gather_output` every rank gets
    the whole y; without, its own slice of the last dimension (for a RowParallelLinear).
    `from_linear(linear, process_set, gather_output=True)` splits an existing Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 process_set: ProcessSet = global_process_set, gather_output: bool = True) -> None:
        super().__init__(in_features, out_features, bias, process_set, split_dim=0)
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(_CopyToSet.apply(x, self.process_set), self.weight, self.bias)
        return _GatherFromSet.apply(y, self.process_set) if self.gather_output else y


class RowParallelLinear(_SplitLinear):
    """y = x W^T + b with the columns of W (the input features) split evenly across
    `process_set`; the parts' products are summed over the set, then b (whole on every rank) is
    added. With `input_is_parallel` x is this rank's slice of the last dimension (a
    ColumnParallelLinear's split output); without, the whole x, of which each rank takes its slice.
    `from_linear(linear, process_set, input_is_parallel=True)` splits an existing Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 process_set: ProcessSet = global_process_set, input_is_parallel: bool = True) -> None:
        super().__init__(in_features, out_features, bias, process_set, split_dim=1)
        self.input_is_parallel = input_is_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = _SplitToSet.apply(x, self.process_set)
        y = _ReduceFromSet.apply(F.linear(x, self.weight), self.process_set)
        return y if self.bias is None else y + self.bias


def _part(features, process_set, what):
    size = process_set.size()
    if size is None:
        raise ValueError(f"{process_set} has not been added: pass it to init() or add_process_set() first")
    if features % size:
        raise ValueError(f"{what}={features} does not divide evenly across the {size} ranks of the process set")
    return features // size


def _mine(tensor, dim, process_set):
    """This rank's part of `tensor` along `dim`."""
    return tensor.chunk(process_set.size(), dim)[process_set.rank()]


def _sum_over(tensor, process_set):
    return tensors.engine_allreduce(tensor.contiguous(), ops.Sum, process_set=process_set)


def _gather_last_dim(tensor, process_set):
    gathered = tensors.plain_allgather(tensor.movedim(-1, 0).contiguous(), process_set=process_set)
    return gathered.movedim(0, -1)


class _CopyToSet(torch.autograd.Function):
    """Forward: the input as it is. Backward: the sum of every rank's gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, process_set: ProcessSet) -> torch.Tensor:
        ctx.process_set = process_set
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _sum_over(grad, ctx.process_set), None


class _ReduceFromSet(torch.autograd.Function):
    """Forward: the sum of every rank's part. Backward: the gradient, to every part as it is."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, process_set: ProcessSet) -> torch.Tensor:
        return _sum_over(x, process_set)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSet(torch.autograd.Function):
    """Forward: every rank's slice, concatenated along the last dimension. Backward: this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, process_set: ProcessSet) -> torch.Tensor:
        ctx.process_set = process_set
        return _gather_last_dim(x, process_set)

    @staticmethod
    def backward(ctx, grad):
        return _mine(grad, -1, ctx.process_set).contiguous(), None


class _SplitToSet(torch.autograd.Function):
    """Forward: this rank's slice of the last dimension. Backward: every rank's slice gathered."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, process_set: ProcessSet) -> torch.Tensor:
        ctx.process_set = process_set
        return _mine(x, -1, process_set).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather_last_dim(grad, ctx.process_set), None
