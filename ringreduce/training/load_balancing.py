"""Dynamic load balancing: each global batch is split among the ranks of a process set in
proportion to their measured speed, and their gradients are weighted by their share of the samples,
so that the update is the one of the same global batch split evenly.

The ranks agree on every split without talking about it: the split of step s is a function of s and
of shares the ranks decided together. Every `interval` steps they share their per-rank compute times
in one small allgather, and the new shares apply one interval later, so a data pipeline may read up to
`interval` batches ahead of training (a DataLoader's workers, tf.data's prefetching) and still split
each batch as every other rank does."""

import itertools
import threading
import time
from collections.abc import Iterator, Sized

import numpy as np

from ringreduce import collectives
from ringreduce.ops import Average, ReduceOp
from ringreduce.process_sets import ProcessSet, global_process_set


class LoadBalancer:
    """The split of each global batch of `batch_size` samples among the ranks of `process_set`.

    The adapters' optimizers (`DistributedOptimizer(..., load_balancer=...)`) weight the gradients
    and report each step; `BalancedBatchSampler` (PyTorch) and `BalancedDataset` (Keras) take each
    batch's split. Every `interval` steps the ranks share their samples per second of computation,
    and each share moves `damping` of the way to its rank's part of the total speed (1: at once;
    smaller: slower but steadier under noise); the new split applies `interval` steps later. Every
    rank keeps at least one sample of every batch."""

    def __init__(self, batch_size: int, interval: int = 10, damping: float = 0.5,
                 process_set: ProcessSet = global_process_set) -> None:
        size = process_set.size()
        if size is None:
            raise ValueError(f"{process_set} is not made yet: add_process_set() it before its load balancer")
        if batch_size < size:
            raise ValueError(f"batch_size ({batch_size}) must be at least the number of ranks ({size})")
        if interval < 1:
            raise ValueError(f"interval must be at least 1, got {interval}")
        if not 0 < damping <= 1:
            raise ValueError(f"damping must be in (0, 1], got {damping}")
        self.batch_size = batch_size
        self.interval = interval
        self.damping = damping
        self.process_set = process_set
        self.steps: int | None = None  # the step training is at (from the sampler's first batch: a resumed epoch's too)
        self._first: int | None = None
        # Exchange k (after k * interval steps) -> the shares it decided, from step (k + 1) * interval on
        # (counted from the first step); 0: the even split. The last few are kept: a pipeline reads at
        # most an interval ahead.
        self._decided = {0: np.full(size, 1.0 / size)}
        self._changed = threading.Condition()  # a pipeline's thread waits there for a split not decided yet
        # step -> (this rank's count, the size of the global batch), as handed out
        self._taken: dict[int, tuple[int, int]] = {}
        self._window = np.zeros(2)  # this rank's samples and compute seconds since the last exchange
        self._clock: float | None = None  # when the last step ended: this rank's work since then is timed
        self._work: float | None = None  # this step's compute seconds, once its gradients are ready
        self._waited = 0.0  # seconds of this step spent in collectives inside the model (SyncBatchNorm's)

    def check_optimizer(self, process_set: ProcessSet | None, backward_passes_per_step: int,
                        op: ReduceOp) -> None:
        """Raise unless an optimizer of these arguments can weight its gradients by this split."""
        if backward_passes_per_step != 1 or op != Average:
            raise ValueError("load balancing weights each rank's mean gradient: it takes op=Average and "
                             "backward_passes_per_step=1")
        if self.process_set is not process_set:
            raise ValueError("the load balancer must split among the optimizer's process set")

    @property
    def shares(self):
        """The newest split, as fractions of the batch per rank of the set."""
        return self._decided[max(self._decided)]

    def split(self, total: int, shares: np.ndarray | None = None) -> np.ndarray:
        """How many of `total` samples each rank takes: the largest remainders of total * shares,
        at least one each (taken from the rank with the most)."""
        exact = (self.shares if shares is None else shares) * total
        counts = np.floor(exact).astype(np.int64)
        counts[np.argsort(counts - exact, kind="stable")[:total - counts.sum()]] += 1
        for empty in np.flatnonzero(counts == 0):
            counts[np.argmax(counts)] -= 1
            counts[empty] = 1
        return counts

    def take(self, step: int, total: int) -> tuple[int, int]:
        """This rank's (offset, count) in the global batch of `total` samples of `step` (counted
        from the start of training, over the epochs): the sampler's call. A pipeline's thread asking
        further ahead than decided waits; training's own thread cannot, and gets an error."""
        with self._changed:
            if self._first is None:
                self._first = self.steps = step
            exchange = self._exchange_for(step)
            if exchange not in self._decided and threading.current_thread() is threading.main_thread():
                raise RuntimeError(
                    f"the data pipeline asked for the split of step {step} at step {self.steps}: it reads more than "
                    f"the balancer's interval ({self.interval}) batches ahead; raise the interval")
            self._changed.wait_for(lambda: exchange in self._decided or exchange < min(self._decided))
            if exchange not in self._decided:
                raise RuntimeError(f"the split of step {step} is long gone (training is at step {self.steps})")
            counts = self.split(total, self._decided[exchange])
            mine = self.process_set.rank()
            self._taken[step] = (int(counts[mine]), total)
        return int(counts[:mine].sum()), int(counts[mine])

    def _exchange_for(self, step):
        """The exchange whose split `step` takes."""
        return max(0, (step - self._first) // self.interval - 1)

    def weight(self) -> float:
        """The factor for this step's gradients (the mean over this rank's samples): its share of
        the batch times the number of ranks, so that averaging over the ranks gives the batch's mean."""
        count, total = self._this_steps_batch()
        return count * len(self.shares) / total

    def _this_steps_batch(self):
        """(this rank's count, the batch's size) of the step training is at."""
        if self.steps not in self._taken:
            raise RuntimeError(f"the load balancer has no batch for step {self.steps}: take the batches from its "
                               "sampler, one per step")
        return self._taken[self.steps]

    def waited(self, seconds: float) -> None:
        """This rank spent `seconds` of the step in a collective inside the model (waiting for the
        others as much as working): not counted as its work."""
        self._waited += seconds

    def work_done(self) -> None:
        """This step's gradients are ready: the time since the last step ended, less what it waited
        in collectives, is this rank's work (loading, forward, backward); not timed before the first
        step."""
        if self._work is None and self._clock is not None:
            self._work = time.perf_counter() - self._clock - self._waited

    def step_done(self) -> None:
        """This step's update is done; every `interval` steps the ranks decide a new split."""
        if self.steps is None or self._first is None:
            raise RuntimeError("step_done() before the sampler handed out this step's batch")
        count, _ = self._this_steps_batch()
        del self._taken[self.steps]
        if self._work is not None:
            self._window += (count, self._work)
        self.steps += 1
        if (self.steps - self._first) % self.interval == 0:
            self._rebalance()
        self._work, self._waited, self._clock = None, 0.0, time.perf_counter()

    def _rebalance(self):
        windows = collectives.allgather(self._window.reshape(1, 2), name="load_balancing.speeds",
                                        process_set=self.process_set)
        self._window = np.zeros(2)
        samples, seconds = windows[:, 0], windows[:, 1]
        shares = self.shares
        if (seconds > 0).all():  # else a rank measured nothing yet: keep the split
            speeds = samples / seconds
            shares = shares + self.damping * (speeds / speeds.sum() - shares)
        with self._changed:
            self._decided[(self.steps - self._first) // self.interval] = shares
            for old in sorted(self._decided)[:-3]:
                del self._decided[old]
            self._changed.notify_all()


class BalancedBatchSampler:
    """The batches of this rank for a DataLoader's `batch_sampler` (or any loop): each epoch the
    dataset's indices in an order every rank draws alike (`shuffle`, from `seed` and the epoch), cut
    into global batches of the balancer's batch_size, of which this rank takes its share. A last
    batch too small to give every rank a sample joins the one before it, so every sample of the
    epoch is used exactly once. Call `set_epoch(epoch)` at the start of each epoch, as with
    torch's DistributedSampler."""

    def __init__(self, dataset: Sized | int, balancer: LoadBalancer, shuffle: bool = True, seed: int = 0) -> None:
        self.length = dataset if isinstance(dataset, int) else len(dataset)
        if self.length < len(balancer.shares):
            raise ValueError(f"{self.length} samples cannot give each of {len(balancer.shares)} ranks one")
        self.balancer = balancer
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_batches(self) -> list[np.ndarray]:
        """This epoch's global batches: arrays of dataset indices, the same on every rank."""
        order = (np.random.default_rng(self.seed + self.epoch).permutation(self.length) if self.shuffle
                 else np.arange(self.length))
        bounds = list(range(0, self.length, self.balancer.batch_size)) + [self.length]
        if len(bounds) > 2 and bounds[-1] - bounds[-2] < len(self.balancer.shares):
            del bounds[-2]
        return [order[start:end] for start, end in itertools.pairwise(bounds)]

    def __iter__(self) -> Iterator[list[int]]:
        first = self.epoch * len(self)
        for step, batch in enumerate(self.global_batches(), start=first):
            offset, count = self.balancer.take(step, len(batch))
            yield batch[offset:offset + count].tolist()

    def __len__(self) -> int:
        batches, last = divmod(self.length, self.balancer.batch_size)
        return batches + (last >= len(self.balancer.shares) or batches == 0)
