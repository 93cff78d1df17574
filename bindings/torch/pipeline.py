"""Pipeline parallelism: the layers of a model split into stages on consecutive ranks of a process
set, micro-batches passed along with isend/recv, on GPipe's schedule (all forwards, then all
backwards) or 1F1B's (one forward, one backward), gradients accumulated over the micro-batches."""

from collections.abc import Callable, Sequence

import torch
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.torch.point_to_point import isend, recv

_MAX_DIMS = 8
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)  # what activations may be


class GPipe:
    """This rank's `stage` of a model whose stages are the ranks of `process_set`, in rank order.

        pipe = rr.GPipe(stage, process_set=pipeline)
        optimizer.zero_grad()
        loss = pipe.step(inputs, targets, F.cross_entropy, micro_batches=4)  # None but on the last stage
        optimizer.step()

    step() runs every micro-batch forward through the stages and backward, so that each
    stage's parameters hold the gradient of the mean of the micro-batches' losses: the gradient
    of the loss of the whole batch when its micro-batches are the same size. The first stage
    passes `inputs`, the last `targets` and `loss_fn`; activations may change shape between
    stages (each transfer says its shape and floating-point dtype first)."""

    def __init__(self, stage: torch.nn.Module, process_set: ProcessSet = global_process_set) -> None:
        ranks, index = process_set.ranks, process_set.rank()
        if ranks is None or index is None:
            raise ValueError(f"a pipeline's stages are the ranks of a process set already made, got {process_set}")
        self.stage, self.process_set = stage, process_set
        self.index, self.stages = index, len(ranks)
        self.previous = ranks[index - 1] if index > 0 else None
        self.next = ranks[index + 1] if index < self.stages - 1 else None

    def step(self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None, micro_batches: int = 1,
             schedule: str = "gpipe") -> torch.Tensor | None:
        """One pass over a batch; returns its loss on the last stage (detached), else None.
        `schedule`: "gpipe" runs every forward, then every backward (in reverse); "1f1b" runs a
        stage's first few forwards, then alternates one forward and one backward, so that a stage
        holds the activations of at most as many micro-batches as there are stages after it.
        Both leave the same gradients (up to the order of the sums)."""
        chunks: Sequence[torch.Tensor | None] = [None] * micro_batches
        labels: Sequence[torch.Tensor | None] = [None] * micro_batches
        if self.previous is None:
            if inputs is None:
                raise ValueError("the first stage of a pipeline needs the inputs")
            chunks = inputs.chunk(micro_batches)
        if self.next is None:
            if targets is None or loss_fn is None:
                raise ValueError("the last stage of a pipeline needs the targets and loss_fn")
            labels = targets.chunk(micro_batches)
        if schedule not in ("gpipe", "1f1b"):
            raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
        if len(chunks) != micro_batches or len(labels) != micro_batches:
            batch = inputs if inputs is not None else targets
            raise ValueError(f"a batch of {len(batch) if batch is not None else 0} cannot make "
                             f"{micro_batches} micro-batches")
        received, produced, sending = {}, {}, []
        for forward, index in _order(schedule, micro_batches, self.stages - self.index - 1):
            if forward:
                x = chunks[index] if self.previous is None else _receive(self.previous, self.process_set, True)
                y = self.stage(x)
                if loss_fn is not None and self.next is None:
                    y = loss_fn(y, labels[index]) / micro_batches
                else:
                    sending += _send(y.detach(), self.next, self.process_set)
                received[index], produced[index] = x, y
            else:
                x, y = received.pop(index), produced[index]
                if self.next is None:
                    y.backward()
                else:
                    y.backward(_receive(self.next, self.process_set))
                if self.previous is not None:
                    sending += _send(x.grad, self.previous, self.process_set)
        for work in sending:
            work.wait()
        return sum(y.detach() for y in produced.values()) if self.next is None else None


def _order(schedule, micro_batches, stages_after):
    """[(forward?, micro-batch)] of one stage: the same micro-batch order on every stage for each
    direction, so that what one stage sends the next receives in turn."""
    if schedule == "gpipe":
        return [(True, i) for i in range(micro_batches)] + [(False, i) for i in reversed(range(micro_batches))]
    warmup = min(stages_after, micro_batches)
    steady = [step for i in range(micro_batches - warmup) for step in ((True, warmup + i), (False, i))]
    return [(True, i) for i in range(warmup)] + steady + [(False, i) for i in range(micro_batches - warmup,
                                                                                    micro_batches)]


def _send(tensor, dst, process_set):
    """The dtype and shape first, so that the receiver can allocate; then the tensor. Both go out
    at once (isend: a stage never blocks on a send while its neighbour sends to it); returns their
    handles."""
    if tensor.dtype not in _DTYPES or tensor.dim() > _MAX_DIMS:
        raise ValueError(f"a pipeline passes floating-point tensors of up to {_MAX_DIMS} dimensions, "
                         f"got {tensor.dtype} of {tensor.dim()}")
    header = torch.zeros(_MAX_DIMS + 2, dtype=torch.int64)
    header[0], header[1] = _DTYPES.index(tensor.dtype), tensor.dim()
    header[2:2 + tensor.dim()] = torch.tensor(tensor.shape)
    return [isend(header, dst, process_set), isend(tensor.contiguous(), dst, process_set)]


def _receive(src, process_set, requires_grad=False):
    """A tensor _send sent."""
    header = torch.zeros(_MAX_DIMS + 2, dtype=torch.int64)
    recv(header, src, process_set)
    tensor = torch.empty(header[2:2 + int(header[1])].tolist(), dtype=_DTYPES[int(header[0])])
    recv(tensor, src, process_set)
    return tensor.requires_grad_(requires_grad)
