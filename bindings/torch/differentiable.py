"""The plain out-of-place collectives on tensors, each an autograd Function, as Horovod's are:
a tensor that requires grad gives a result that does too. Each backward follows Horovod's rule
(ringreduce.training.gradients), and is made of collectives too: every rank runs backward through the
same collectives in the same order.
"""

from collections.abc import Sequence

import ringreduce as core
import torch
from ringreduce import ops
from ringreduce.collectives import grouped_names
from ringreduce.numerics import compression as compressors
from ringreduce.numerics.compression import CompressorLike
from ringreduce.ops import ReduceOp
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.torch import tensors as calls
from ringreduce.torch.compression import Compression, in_engine
from ringreduce.training import gradients


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: CompressorLike = Compression.none, op: ReduceOp | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Combine `tensor` over every rank of `process_set` (Average by default); a new tensor."""
    op = ops.from_average(op, average)
    return _compressed(compression, [tensor], [name], lambda engine, t: [
        _Allreduce.apply(t[0], op, name, prescale_factor, postscale_factor, engine, process_set)])[0]


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: CompressorLike = Compression.none, op: ReduceOp | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """allreduce of several tensors submitted together, so that they fuse; a list of new tensors."""
    op = ops.from_average(op, average)
    return _compressed(compression, tensors, grouped_names(name, len(tensors)), lambda engine, ts: list(
        _GroupedAllreduce.apply(op, name, prescale_factor, postscale_factor, engine, process_set, *ts)))


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the first dimension (which may differ by rank), in
    the order of the ranks of `process_set`."""
    return _Allgather.apply(name, process_set, tensor)[0]


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    return list(_Allgather.apply(name, process_set, *tensors))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """The root rank's `tensor` (root_rank is a global rank), on every rank of `process_set`."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def alltoall(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Block j of the first dimension to rank j (of `process_set`), one block from each rank back;
    with `splits` (rows per rank), also the rows received from each rank."""
    return _Alltoall.apply(tensor, name, None if splits is None else calls._ints(splits), process_set)


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: CompressorLike = Compression.none,
                  op: ReduceOp | None = core.Average, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Combine every rank's `tensor`; this rank keeps its share of the first dimension (the first
    ranks one row more where it does not divide evenly)."""
    return grouped_reducescatter([tensor], name, compression, op, process_set, prescale_factor, postscale_factor)[0]


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: CompressorLike = Compression.none, op: ReduceOp | None = core.Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    return _compressed(compression, tensors, grouped_names(name, len(tensors)), lambda engine, ts: list(
        _Reducescatter.apply(op, name, prescale_factor, postscale_factor, process_set, *ts)), engine_compresses=False)


def _compressed(compression, inputs, names, run, engine_compresses=True):
    """run(engine compression, tensors): the built-in compressions are the engine's; a compressor
    of the user's own compresses before the collective and decompresses after (given each
    tensor's name where it keeps state per tensor)."""
    engine = in_engine(compression)
    if engine is not None and (engine_compresses or engine is in_engine(Compression.none)):
        return run(engine, inputs)
    packed = compressors.compress_all(compression, inputs, names)
    results = run(in_engine(Compression.none), [t for t, _ in packed])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, packed, strict=True)]


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, prescale, postscale, engine, process_set):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale, postscale, process_set
        return calls.engine_allreduce(tensor, op, name, prescale, postscale, engine, process_set)

    @staticmethod
    def backward(ctx, grad):
        gradients.check_differentiable(ctx.op, "allreduce")
        return (allreduce(grad, op=ctx.op, prescale_factor=ctx.prescale, postscale_factor=ctx.postscale,
                          process_set=ctx.process_set),) + (None,) * 6


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale, postscale, engine, process_set, *inputs):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale, postscale, process_set
        return tuple(calls.engine_grouped_allreduce_async(inputs, op, name, prescale, postscale, engine,
                                                          process_set).wait())

    @staticmethod
    def backward(ctx, *grads):
        gradients.check_differentiable(ctx.op, "grouped_allreduce")
        return (None,) * 6 + tuple(grouped_allreduce(list(grads), op=ctx.op, prescale_factor=ctx.prescale,
                                                     postscale_factor=ctx.postscale, process_set=ctx.process_set))


class _Allgather(torch.autograd.Function):
    """One or several tensors; backward: each rank's rows of the gradient averaged over the ranks."""

    @staticmethod
    def forward(ctx, name, process_set, *inputs):
        ctx.rows, ctx.process_set = [t.shape[0] for t in inputs], process_set
        return tuple(calls.grouped_allgather_async(inputs, name, process_set).wait())

    @staticmethod
    def backward(ctx, *grads):
        averaged = grouped_allreduce(list(grads), op=gradients.GATHERED_GRADIENT_OP, process_set=ctx.process_set)
        every_ranks_rows = calls.allgather_async(torch.tensor([ctx.rows], dtype=torch.int64),
                                                 process_set=ctx.process_set).wait()
        starts = every_ranks_rows[:ctx.process_set.rank()].sum(dim=0).tolist()
        return (None, None) + tuple(g.narrow(0, start, rows) for g, start, rows in zip(averaged, starts, ctx.rows,
                                                                                  strict=True))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return calls.broadcast_async(tensor, root_rank, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        averaged = allreduce(grad, op=gradients.GATHERED_GRADIENT_OP, process_set=ctx.process_set)
        return (averaged if core.rank() == ctx.root_rank else averaged * 0), None, None, None


class _Alltoall(torch.autograd.Function):
    """Backward: the gradient's blocks go back where their rows came from."""

    @staticmethod
    def forward(ctx, tensor, name, splits, process_set):
        ctx.process_set = process_set
        output, received = calls.alltoall_pair_async(tensor, splits, name, process_set, pair=True).wait()
        ctx.received = received.tolist()
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, *_received):
        back, _ = calls.alltoall_async(grad.contiguous(), ctx.received, process_set=ctx.process_set).wait()
        return back, None, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale, postscale, process_set, *inputs):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale, postscale, process_set
        return tuple(calls.grouped_reducescatter_async(inputs, name, op, process_set, prescale, postscale).wait())

    @staticmethod
    def backward(ctx, *grads):
        scale = gradients.reducescatter_scale(ctx.op, ctx.prescale, ctx.postscale, ctx.process_set.size())
        return (None,) * 5 + tuple(g * scale for g in grouped_allgather([g.contiguous() for g in grads],
                                                                        process_set=ctx.process_set))
