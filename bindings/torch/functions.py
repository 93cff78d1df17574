"""Making every rank start from the same model and optimizer state."""

from collections.abc import Iterable, Mapping

import ringreduce as core
import torch
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.torch import tensors
from ringreduce.torch.optimizer import _DistributedOptimizer


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], root_rank: int = 0,
                         prefix: str | None = None, process_set: ProcessSet = global_process_set) -> None:
    """Copy the root rank's tensors into every rank's (of `process_set`: an extension, as below):
    a state_dict, or (name, tensor) pairs such as model.named_parameters(). `prefix` goes in front
    of the collectives' names, for several broadcasts at once."""
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(tensor).__name__}, not a tensor")
        with torch.no_grad():
            tensors.broadcast_(tensor, root_rank, f"{prefix or ''}broadcast.{name}", process_set)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              model: torch.nn.Module | None = None,
                              process_set: ProcessSet = global_process_set) -> None:
    """Give every rank (of `process_set`: an extension, Horovod's takes none) the root rank's
    optimizer state (Adam's moments and step counts, every param group's hyper-parameters).

    An optimizer without state yet first takes one step with zero gradients, as Horovod's does,
    so that its state exists (Adam's step count is then 1, SGD's momentum buffers zero); the
    gradients stay zero afterwards, None where a parameter needs none. Sparse zeros go to
    SparseAdam, and to SGD for the sparse embeddings of `model`. The state dict travels whole."""
    if not optimizer.state_dict()["state"]:
        _initialize_state(optimizer, model)
    state = core.broadcast_object(obj=optimizer.state_dict(), root_rank=root_rank, name="broadcast.optimizer_state",
                                  process_set=process_set)
    optimizer.load_state_dict(state)


def _initialize_state(optimizer, model):
    sparse = set()
    if model is not None:
        sparse = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.sparse
                  for p in m.parameters()}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if parameter.requires_grad:
                parameter.grad = torch.zeros_like(parameter)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(parameter) in sparse):
                    parameter.grad = parameter.grad.to_sparse()
    # The wrapped optimizer's own step: a DistributedOptimizer's would average, which every rank
    # of its set would have to join.
    step = super(_DistributedOptimizer, optimizer).step if isinstance(optimizer, _DistributedOptimizer) else \
        optimizer.step
    step()
