"""Dynamic load balancing: each global batch is split among the ranks of a process set in
proportion to their measured speed, and their gradients are weighted by their share of the samples,
so that the update is the one of the same global batch split evenly.

The ranks agree on every split without talking about it: each rank's sampler asks for the splits in
the same order, and the shares change only at the same steps everywhere, from per-rank compute times
the ranks exchange in one small allgather every `interval` steps."""

import collections
import itertools

import numpy as np

from ringreduce import collectives
from ringreduce.process_sets import global_process_set


class LoadBalancer:
    """The split of each global batch of `batch_size` samples among the ranks of `process_set`.

    The adapters' optimizers (`DistributedOptimizer(..., load_balancer=...)`) report each step's
    compute time and weight the gradients; `BalancedBatchSampler` takes each batch's split. Every
    `interval` steps the ranks share their samples per second of computation, and each share moves
    `damping` of the way to its rank's part of the total speed (1: at once; smaller: slower but
    steadier under noise). Every rank keeps at least one sample of every batch."""

    def __init__(self, batch_size, interval=10, damping=0.5, process_set=global_process_set):
        if batch_size < process_set.size():
            raise ValueError(f"batch_size ({batch_size}) must be at least the number of ranks ({process_set.size()})")
        if interval < 1:
            raise ValueError(f"interval must be at least 1, got {interval}")
        if not 0 < damping <= 1:
            raise ValueError(f"damping must be in (0, 1], got {damping}")
        self.batch_size = batch_size
        self.interval = interval
        self.damping = damping
        self.process_set = process_set
        self.shares = np.full(process_set.size(), 1.0 / process_set.size())
        self.steps = 0
        self._issued = collections.deque()  # (this rank's count, the batch's total) of batches taken, in order
        self._window = np.zeros(2)  # this rank's samples and compute seconds since the last exchange

    def split(self, total):
        """How many of `total` samples each rank takes: the largest remainders of total * shares,
        at least one each."""
        exact = self.shares * total
        counts = np.floor(exact).astype(np.int64)
        counts[np.argsort(counts - exact, kind="stable")[:total - counts.sum()]] += 1
        for empty in np.flatnonzero(counts == 0):  # from the rank with the most
            counts[np.argmax(counts)] -= 1
            counts[empty] = 1
        return counts

    def take(self, total):
        """This rank's (offset, count) in the next batch of `total` samples (the sampler's call)."""
        counts = self.split(total)
        mine = self.process_set.rank()
        self._issued.append((int(counts[mine]), total))
        return int(counts[:mine].sum()), int(counts[mine])

    def weight(self):
        """The factor for this step's gradients (the mean over this rank's samples): its share of
        the batch times the number of ranks, so that averaging over the ranks gives the batch's
        mean. Taken once per step, in the order the sampler gave the batches."""
        if not self._issued:
            raise RuntimeError("the load balancer has no batch for this step: take the batches from its "
                               "BalancedBatchSampler, one per step")
        count, total = self._issued[0]
        return count * len(self.shares) / total

    def step_done(self, compute_seconds):
        """This step's batch is done, after `compute_seconds` of this rank's own work (None where not
        measured: the first step); every `interval` steps the shares move toward the ranks' speeds."""
        count, _ = self._issued.popleft()
        if compute_seconds is not None:
            self._window += (count, compute_seconds)
        self.steps += 1
        if self.steps % self.interval == 0:
            self._rebalance()

    def _rebalance(self):
        windows = collectives.allgather(self._window.reshape(1, 2), name="load_balancing.speeds",
                                        process_set=self.process_set)
        self._window = np.zeros(2)
        samples, seconds = windows[:, 0], windows[:, 1]
        if (seconds <= 0).any():  # a rank that measured nothing yet: keep the split
            return
        speeds = samples / seconds
        self.shares = self.shares + self.damping * (speeds / speeds.sum() - self.shares)

    def state_dict(self):
        return {"shares": self.shares.tolist(), "steps": self.steps}

    def load_state_dict(self, state):
        if len(state["shares"]) != len(self.shares):  # another number of ranks: start even
            return
        self.shares, self.steps = np.array(state["shares"]), state["steps"]


class BalancedBatchSampler:
    """The batches of this rank for a DataLoader's `batch_sampler` (or any loop): each epoch the
    dataset's indices in an order every rank draws alike (`shuffle`, from `seed` and the epoch), cut
    into global batches of the balancer's batch_size, of which this rank takes its share. A last
    batch too small to give every rank a sample joins the one before it, so every sample of the
    epoch is used exactly once. Call `set_epoch(epoch)` at the start of each epoch, as with
    torch's DistributedSampler."""

    def __init__(self, dataset, balancer, shuffle=True, seed=0):
        self.length = dataset if isinstance(dataset, int) else len(dataset)
        if self.length < len(balancer.shares):
            raise ValueError(f"{self.length} samples cannot give each of {len(balancer.shares)} ranks one")
        self.balancer = balancer
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def global_batches(self):
        """This epoch's global batches: arrays of dataset indices, the same on every rank."""
        order = (np.random.default_rng(self.seed + self.epoch).permutation(self.length) if self.shuffle
                 else np.arange(self.length))
        bounds = list(range(0, self.length, self.balancer.batch_size)) + [self.length]
        if len(bounds) > 2 and bounds[-1] - bounds[-2] < len(self.balancer.shares):
            del bounds[-2]
        return [order[start:end] for start, end in itertools.pairwise(bounds)]

    def __iter__(self):
        for batch in self.global_batches():
            offset, count = self.balancer.take(len(batch))
            yield batch[offset:offset + count].tolist()

    def __len__(self):
        batches, last = divmod(self.length, self.balancer.batch_size)
        return batches + (last >= len(self.balancer.shares) or batches == 0)
