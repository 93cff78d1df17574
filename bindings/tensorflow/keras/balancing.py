"""Load balancing for Keras's fit: this rank's share of each global batch, as a PyDataset."""

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from ringreduce.training.load_balancing import BalancedBatchSampler, LoadBalancer


class BalancedDataset(keras.utils.PyDataset):
    """`model.fit(rr.BalancedDataset(x, y, balancer), epochs=..., shuffle=False)`: each epoch, this
    rank's part of every global batch of (x, y), split by the `LoadBalancer` that the model's
    `DistributedOptimizer(..., load_balancer=balancer)` weights the gradients with. The order is
    drawn from `seed` and the epoch (`shuffle`), the same on every rank, so fit must not shuffle the
    batches itself, and it reads them with one worker (PyDataset's default): asked for them out of
    order, it raises. An epoch begins when Keras asks for the first batch again after the last one
    (it also reads the first batches ahead of fit)."""

    def __init__(self, x: Sequence[Any], y: Sequence[Any], balancer: LoadBalancer, shuffle: bool = True, seed: int = 0,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if len(x) != len(y):
            raise ValueError(f"x and y must hold as many samples, got {len(x)} and {len(y)}")
        self.x, self.y = x, y
        self.sampler = BalancedBatchSampler(len(x), balancer, shuffle, seed)
        self._batches = self.sampler.global_batches()
        self._next = 0  # the batch Keras should ask for next (or 0 again)

    def __len__(self):
        return len(self._batches)

    def __getitem__(self, index):
        mine = self.indices(index)
        return self.x[mine], self.y[mine]

    def set_epoch(self, epoch: int) -> None:
        """Start at `epoch` (a resumed job's, with fit's initial_epoch)."""
        self.sampler.set_epoch(epoch)
        self._batches = self.sampler.global_batches()
        self._next = 0

    def indices(self, index: int) -> np.ndarray:
        """The dataset indices of this rank's part of the epoch's batch `index`."""
        if index == 0 and self._next == len(self):
            self.set_epoch(self.sampler.epoch + 1)
        if index not in (0, self._next):
            raise ValueError(f"Keras asked for batch {index} after batch {self._next - 1}: call fit with shuffle=False "
                             "(BalancedDataset shuffles itself, alike on every rank)")
        self._next = index + 1
        batch = self._batches[index]
        offset, count = self.sampler.balancer.take(self.sampler.epoch * len(self) + index, len(batch))
        return batch[offset:offset + count]
