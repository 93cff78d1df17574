"""Making every rank start from the same model and optimizer state."""

import ringreduce as core
import torch
from ringreduce.process_sets import global_process_set
from ringreduce.torch import tensors


def broadcast_parameters(params, root_rank=0, prefix=None, process_set=global_process_set):
    """Copy the root rank's tensors into every rank's (of `process_set`: an extension, as below):
    a state_dict, or (name, tensor) pairs such as model.named_parameters(). `prefix` goes in front
    of the collectives' names, for several broadcasts at once."""
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(tensor).__name__}, not a tensor")
        with torch.no_grad():
            tensors.broadcast_(tensor, root_rank, f"{prefix or ''}broadcast.{name}", process_set)


def broadcast_optimizer_state(optimizer, root_rank=0, model=None, process_set=global_process_set):
    """Give every rank (of `process_set`: an extension, Horovod's takes none) the root rank's
    optimizer state (Adam's moments and step counts, every param group's hyper-parameters), also
    before the first step, when it is empty. `model` is Horovod's argument for naming the state's
    tensors; the state dict travels whole here, so it needs none."""
    state = core.broadcast_object(obj=optimizer.state_dict(), root_rank=root_rank, name="broadcast.optimizer_state",
                                  process_set=process_set)
    optimizer.load_state_dict(state)
