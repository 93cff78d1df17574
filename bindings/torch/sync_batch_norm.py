"""SyncBatchNorm: batch normalization whose statistics come from all ranks' batches together."""

import time

import ringreduce as core
import torch
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.torch import tensors
from ringreduce.training.load_balancing import LoadBalancer
from torch.nn.modules.batchnorm import _BatchNorm


class SyncBatchNorm(_BatchNorm):
    """A drop-in for torch.nn.BatchNorm1d/2d/3d: in training, mean and variance are those of the
    batch made of every rank's batch (of `process_set`'s ranks: an extension, Horovod's has none);
    the backward pass is that of the same global batch.

    With load balancing (`load_balancer`, ringreduce's), the ranks' batches differ in size and each
    rank's loss is the mean over its own: the backward pass weights each rank's part as the
    optimizer weights its gradients, so that it is still the global batch's."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, process_set: ProcessSet = global_process_set,
                 load_balancer: LoadBalancer | None = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.process_set = process_set
        self.load_balancer = load_balancer

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected an input of at least 2 dimensions, got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training or self.process_set.size() == 1:
            return super().forward(input)
        if self.momentum is None:
            raise ValueError("SyncBatchNorm needs a momentum (a cumulative average is not supported)")
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked += 1
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, self.running_mean, self.running_var,
                                            self.eps, self.momentum, self.process_set, self.load_balancer)


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: torch.Tensor, weight, bias, running_mean, running_var, eps: float, momentum: float,
                process_set: ProcessSet, balancer) -> torch.Tensor:
        channels = input.shape[1]
        dims = [d for d in range(input.dim()) if d != 1]
        count = input.numel() // channels
        local = torch.cat([input.sum(dims), (input * input).sum(dims),
                           torch.tensor([float(count)], dtype=input.dtype)]).double()
        total = _allreduce_sum(local, process_set, balancer)
        ctx.process_set, ctx.balancer = process_set, balancer
        ctx.rank_weight = 1.0 if balancer is None else balancer.weight()
        n = total[-1]
        mean = total[:channels] / n
        var = total[channels:2 * channels] / n - mean * mean
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
                running_var.mul_(1 - momentum).add_(momentum * (var * n / (n - 1)).to(running_var.dtype))
        mean, invstd = mean.to(input.dtype), torch.rsqrt(var + eps).to(input.dtype)
        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.n = float(n)
        shape = [1, channels] + [1] * (input.dim() - 2)
        output = (input - mean.view(shape)) * invstd.view(shape)
        if weight is not None:
            output = output * weight.view(shape) + bias.view(shape)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        channels = input.shape[1]
        dims = [d for d in range(input.dim()) if d != 1]
        shape = [1, channels] + [1] * (input.dim() - 2)
        centered = input - mean.view(shape)
        sum_dy = grad_output.sum(dims)
        sum_dy_centered = (grad_output * centered).sum(dims)
        grad_weight = (sum_dy_centered * invstd) if weight is not None else None
        grad_bias = sum_dy if weight is not None else None
        # Each rank's grad_output is of the mean over its own samples; the global batch's is that times
        # the rank's weight (its share times the number of ranks), which the optimizer applies later.
        total = _allreduce_sum(torch.cat([sum_dy, sum_dy_centered]).double() * ctx.rank_weight, ctx.process_set,
                               ctx.balancer).to(input.dtype)
        mean_dy = total[:channels] / (ctx.n * ctx.rank_weight)
        mean_dy_centered = total[channels:] / (ctx.n * ctx.rank_weight)
        scale = invstd if weight is None else invstd * weight
        grad_input = (grad_output - mean_dy.view(shape)
                      - centered * (invstd * invstd * mean_dy_centered).view(shape)) * scale.view(shape)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


def _allreduce_sum(tensor, process_set, balancer):
    """The sum over the set's ranks; the time it took is waiting, not this rank's work, for a balancer."""
    start = time.perf_counter()
    total = tensors.engine_allreduce(tensor, core.Sum, process_set=process_set)
    if balancer is not None:
        balancer.waited(time.perf_counter() - start)
    return total
