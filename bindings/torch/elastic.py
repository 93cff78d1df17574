"""Elastic training with PyTorch, under horovod.torch.elastic's names: TorchState keeps the model,
the optimizer, samplers and plain values; ElasticSampler hands each rank its part of what is left
of the epoch, so that after a resize no sample of the epoch is taken twice (see ringreduce.elastic).

    sampler = rr.elastic.ElasticSampler(dataset, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
    state = rr.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @rr.elastic.run
    def train(state):
        for epoch in range(state.epoch, epochs):
            state.epoch = epoch
            for batch_idx, (x, y) in enumerate(loader):
                ...step...
                state.sampler.record_batch(batch_idx, 32)
                if batch_idx % 10 == 9:
                    state.commit()
            state.sampler.set_epoch(epoch + 1)
            state.epoch = epoch + 1     # before the commit: a resize there resumes at the next epoch
            state.commit()
"""

import io
import pickle
from collections.abc import Sized
from typing import Any

import torch
from ringreduce import runtime
from ringreduce.elastic import ObjectState, State, run  # noqa: F401 - Horovod's names, here too
from ringreduce.errors import HostsUpdatedInterrupt  # noqa: F401


class TorchState(State):
    """A model's and an optimizer's state_dict, the state_dict of any keyword value that has one
    (samplers), and the other keyword values as attributes (`state.epoch`)."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs) -> None:
        self.model, self.optimizer = model, optimizer
        self._names = tuple(kwargs)
        self.__dict__.update(kwargs)
        super().__init__()

    def _state(self):
        values = {name: getattr(self, name) for name in self._names}
        return {
            "model": None if self.model is None else self.model.state_dict(),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "values": {name: value.state_dict() if hasattr(value, "state_dict") else value
                       for name, value in values.items()},
        }

    def _pickle(self, state):
        buffer = io.BytesIO()
        _TensorsAsArrays(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
        return buffer.getbuffer()  # the bytes themselves, not a copy

    def _load(self, state):
        if self.model is not None:
            self.model.load_state_dict(state["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        for name, value in state["values"].items():
            current = getattr(self, name, None)
            if hasattr(current, "load_state_dict"):
                current.load_state_dict(value)
            else:
                setattr(self, name, value)


class _TensorsAsArrays(pickle.Pickler):
    """Pickles CPU tensors that numpy can hold as numpy arrays (three times as fast as torch's own
    pickling: 157 against 464 ms for 256 MB here), unpickled as tensors again."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided \
                and not obj.requires_grad and obj.dtype in _NUMPY_DTYPES:
            return torch.from_numpy, (obj.numpy(),)
        return NotImplemented


_NUMPY_DTYPES = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
                 torch.uint8, torch.bool, torch.complex64, torch.complex128}


class ElasticSampler(torch.utils.data.Sampler):
    """Each epoch's order (shuffled with seed + epoch, or in order), of which this rank takes every
    size()-th of what the job has not yet taken this epoch. `record_batch(batch_idx, batch_size)`
    after each batch says how far the job got (every rank takes its batch_idx-th batch at the same
    step); the position is part of the state, so a resized job goes on with the rest of the epoch.
    Every rank gets the same number of samples: up to size()-1 at the epoch's end are left out (as
    DistributedSampler's drop_last), so that none is taken twice."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed = 0  # how many of this epoch's order the job has taken
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning."""
        self.epoch, self.processed = epoch, 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """The job has taken batches 0 to `batch_idx` of `batch_size` on every rank, since reset()."""
        self.processed = self._start + min((batch_idx + 1) * batch_size, len(self.indices)) * self.num_replicas

    def reset(self) -> None:
        """This rank's part of the rest of the epoch, for the job's size now."""
        self.num_replicas, self.rank = runtime.size(), runtime.rank()
        self._start = self.processed
        if self.shuffle:
            order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(len(self.dataset))
        rest = order[self.processed:].tolist()
        self.indices = rest[self.rank::self.num_replicas][:len(rest) // self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed": self.processed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.processed = state["epoch"], state["processed"]
        self.reset()
