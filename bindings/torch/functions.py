"""Making every rank start from the same model and optimizer state."""

import ringreduce as core
import torch
from ringreduce.torch import tensors


def broadcast_parameters(params, root_rank=0):
    """Copy the root rank's tensors into every rank's: a state_dict, or (name, tensor) pairs
    such as model.named_parameters()."""
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(tensor).__name__}, not a tensor")
        with torch.no_grad():
            tensors.broadcast_(tensor, root_rank, name=f"broadcast.{name}")


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Give every rank the root rank's optimizer state (Adam's moments and step counts, every
    param group's hyper-parameters), also before the first step, when it is empty."""
    state = core.broadcast_object(obj=optimizer.state_dict(), root_rank=root_rank, name="broadcast.optimizer_state")
    optimizer.load_state_dict(state)
