"""Local SGD (post-local SGD, Lin et al. 2018) with torch.distributed's names: every rank steps on
its own, and the model is averaged over the ranks every `period` steps, after `warmup_steps` of
synchronous gradient averaging.

    averager = rr.PeriodicModelAverager(period=4, warmup_steps=100)
    optimizer = rr.PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), averager)

Between averages the replicas differ by design; right after each they hold the same bits.
torch.distributed pairs its optimizer with DDP and a communication hook for the warm-up; here the
optimizer averages the gradients itself until the warm-up ends, so no hook is needed.

An outer optimizer (DiLoCo, Douillard et al. 2023) makes each average a step of its own: the
ranks' mean change since the last average is the "gradient" of an optimizer over a copy of the
model held at that average, for example Nesterov momentum:

    rr.PeriodicModelAverager(period=4, outer_optimizer=lambda params: torch.optim.SGD(
        params, lr=0.7, momentum=0.9, nesterov=True))
"""

from collections.abc import Callable, Iterable
from typing import Any

import torch
from ringreduce import ops
from ringreduce.numerics.compression import Compressor
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.torch import tensors
from ringreduce.torch.compression import Compression, in_engine
from ringreduce.training import local_sgd as schedule


class PeriodicModelAverager:
    """Averages parameters every `period` steps from step `warmup_steps` on, over `process_set`.

    `compression` (ringreduce's: `Compression.fp16` or `bf16`) sends each average's change of the
    model since the last average in that dtype instead of the model in full: every rank then adds
    the same averaged change to the same model, so the replicas still hold the same bits after each
    average, with half the bytes (the first average, which sets that model, goes in full)."""

    def __init__(self, period: int, warmup_steps: int = 0, process_set: ProcessSet = global_process_set,
                 outer_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None,
                 compression: type[Compressor] = Compression.none) -> None:
        schedule.check(period, warmup_steps)
        self.period, self.warmup_steps, self.process_set = period, warmup_steps, process_set
        self.step = 0
        self._average = schedule.ModelAverage("local_sgd.parameters", in_engine(compression),
                                              _OuterStep(outer_optimizer) if outer_optimizer is not None else None)

    def _set_for(self, step):
        """The set this step averages over, or None when it does not average."""
        return self.process_set if schedule.averages_after(step, self.period, self.warmup_steps) else None

    def average_parameters(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]]) -> ProcessSet | None:
        """Average `params` (parameters, or param_groups) if this step is one that averages; count
        the step. Returns the process set it averaged over, None when it did not."""
        process_set = self._set_for(self.step)
        self.step += 1
        if process_set is None:
            return None
        parameters = _parameters(params)
        with torch.no_grad():
            arrays = [tensors.as_array(p.data) for p in parameters]
            self._average(arrays, process_set)
            for parameter, array in zip(parameters, arrays, strict=True):
                if parameter.dtype == torch.bfloat16:  # as_array's float32 copy: averaged there
                    parameter.copy_(tensors.as_tensor(array, parameter))
        return process_set


class HierarchicalModelAverager(PeriodicModelAverager):
    """Averages inside groups of consecutive ranks often and across larger groups seldom:
    `period_group_size_dict` ({period: group size}, e.g. {1: 2, 4: 4} averages every step among
    pairs and every fourth step among all four); at each step the largest period that divides it
    chooses the group. The last group size must be the size of `process_set`. Every rank makes
    the groups' process sets together when this is built."""

    def __init__(self, period_group_size_dict: dict[int, int], warmup_steps: int = 0,
                 process_set: ProcessSet = global_process_set) -> None:
        self._groups = schedule.hierarchy(period_group_size_dict, process_set)
        super().__init__(min(self._groups), warmup_steps, process_set)

    def _set_for(self, step):
        return schedule.group_after(self._groups, step, self.warmup_steps)


class PostLocalSGDOptimizer(torch.optim.Optimizer):
    """Wraps a local optimizer: until the averager's warm-up ends each step averages the gradients
    (so the replicas stay the same), then each rank steps on its own and the averager averages
    the model. `average_optimizer_state` averages the optimizer's floating state (momentum,
    Adam's moments) with the model."""

    def __init__(self, optim: torch.optim.Optimizer, averager: PeriodicModelAverager,
                 average_optimizer_state: bool = False) -> None:
        self.optim, self.averager = optim, averager
        self.average_optimizer_state = average_optimizer_state
        self.param_groups, self.defaults = optim.param_groups, optim.defaults

    @property
    def state(self):
        return self.optim.state

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        if self.averager.step < self.averager.warmup_steps:
            gradients = []
            for parameter in _parameters(self.param_groups):
                if parameter.grad is None:
                    parameter.grad = torch.zeros_like(parameter)
                gradients.append(parameter.grad)
            _average(gradients, self.averager.process_set, "local_sgd.gradients")
        loss = self.optim.step(closure)
        averaged_over = self.averager.average_parameters(self.param_groups)
        if averaged_over is not None and self.average_optimizer_state:
            states = [self.optim.state[p] for p in _parameters(self.param_groups)]
            floating = [value for state in states for _, value in sorted(state.items())
                        if torch.is_tensor(value) and value.is_floating_point() and value.dim() > 0]
            _average(floating, averaged_over, "local_sgd.optimizer_state")
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {**self.optim.state_dict(), "step": self.averager.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        self.averager.step = state_dict.pop("step", 0)
        self.optim.load_state_dict(state_dict)


class _OuterStep:
    """DiLoCo's outer step for ModelAverage: the torch optimizer `make_optimizer` builds over the
    anchors (tensors sharing their arrays' memory) steps them along the given changes."""

    def __init__(self, make_optimizer) -> None:
        self._make_optimizer = make_optimizer
        self._anchors = self._optimizer = None

    def __call__(self, anchors, changes):
        if self._optimizer is None:
            self._anchors = [_shared_tensor(a) for a in anchors]
            self._optimizer = self._make_optimizer(self._anchors)
        with torch.no_grad():
            for anchor, change in zip(self._anchors, changes, strict=True):
                anchor.grad = _shared_tensor(change)
            self._optimizer.step()


def _shared_tensor(array):
    return torch.from_dlpack(array) if type(array).__module__.split(".")[0] == "cupy" else torch.from_numpy(array)


def _parameters(params):
    """The parameters that train, from parameters or param_groups, in order."""
    params = list(params)
    if params and isinstance(params[0], dict):
        params = [p for group in params for p in group["params"]]
    return [p for p in params if p.requires_grad]


def _average(tensors_, process_set, name):
    if tensors_:
        tensors.grouped_allreduce_(tensors_, op=ops.Average, name=name, process_set=process_set)
