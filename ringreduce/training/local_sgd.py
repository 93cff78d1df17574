"""When local SGD averages (post-local SGD, torch.distributed's schedule): every step of the
warm-up averages (gradients, or for an adapter that only sees the model, the model), then every
`period`-th step from the end of the warm-up on, starting with its first; hierarchically, over
groups of ranks that grow with the period. The adapters (ringreduce.torch's PeriodicModelAverager
and HierarchicalModelAverager, ringreduce.tensorflow.keras's LocalSGDCallback and
HierarchicalLocalSGDCallback) hand the model's weights to ModelAverage; the schedule and the
average itself are what they share."""

import collections
from collections.abc import Callable

from ringreduce import collectives
from ringreduce.numerics.compression import Compression
from ringreduce.ops import Average
from ringreduce.process_sets import ProcessSet, add_process_set


def check(period, warmup_steps):
    if period < 1:
        raise ValueError(f"period must be at least 1, got {period}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be at least 0, got {warmup_steps}")


def averages_after(step, period, warmup_steps):
    """Whether the model is averaged after local step `step` (counted from 0) that follows the
    warm-up."""
    return step >= warmup_steps and (step - warmup_steps) % period == 0


def hierarchy(period_group_size_dict, process_set):
    """{period: this rank's group}, largest period first, for averaging inside groups of
    consecutive ranks of `process_set` often and across larger groups seldom (e.g. {1: 2, 4: 4}:
    every step among pairs, every fourth among all four). The last group size must be the set's
    size. Every rank of the set makes the groups' process sets together, here."""
    if not period_group_size_dict:
        raise ValueError("period_group_size_dict must name at least one period")
    periods = sorted(period_group_size_dict)
    sizes = [period_group_size_dict[p] for p in periods]
    if sizes[-1] != process_set.size():
        raise ValueError(f"the last group size ({sizes[-1]}) must be the size of the process set "
                         f"({process_set.size()})")
    if any(size < 1 or process_set.size() % size for size in sizes):
        raise ValueError(f"every group size must divide the process set's size ({process_set.size()}), got {sizes}")
    ranks = process_set.ranks
    groups = collections.OrderedDict()
    for period, size in reversed(list(zip(periods, sizes, strict=True))):
        if size == len(ranks):
            groups[period] = process_set
        else:
            made = [add_process_set(ProcessSet(ranks[start:start + size])) for start in range(0, len(ranks), size)]
            groups[period] = next(s for s in made if s.included())
    return groups


def group_after(groups, step, warmup_steps):
    """The group that averages after local step `step` (the largest period that divides its
    count from the end of the warm-up), or None: during the warm-up, or a step no period divides."""
    if step < warmup_steps:
        return None
    return next((group for period, group in groups.items() if (step - warmup_steps) % period == 0), None)


class ModelAverage:
    """One average of a model's weights (numpy or CuPy arrays, changed in place) over a process
    set, as every local SGD adapter makes it.

    With `compression` (the engine's Compression.fp16 or bf16) each average after the first sends
    the change since the last average in that dtype: every rank adds the same averaged change to
    the same last average, so the replicas still hold the same bits, with half the bytes (the
    first average, which sets that model, goes in full).

    With `outer_step` (DiLoCo, Douillard et al. 2023) each average is a step of an outer
    optimizer: a copy of the weights as of the last average (the anchor) moves along the ranks'
    mean change since then, and the weights become the anchor. `outer_step(anchors, changes)`
    runs the binding's optimizer on the anchors in place, with anchor - weights as its gradient;
    the first average only sets the anchors."""

    def __init__(self, name: str, compression: object = Compression.none,
                 outer_step: Callable[[list, list], None] | None = None):
        """`compression`: the engine's form of a binding's compressor (its in_engine(); None for a
        compressor of the user's own, which local SGD does not take)."""
        if compression is None:
            raise ValueError("local SGD compresses the model's changes with Compression.fp16 or Compression.bf16")
        self.name, self._compression, self._outer_step = name, compression, outer_step
        self._last = None  # with compression: the weights right after the last average
        self._anchors = None  # with an outer step: the anchors

    def __call__(self, weights: list, process_set: ProcessSet, outer: bool = True, in_full: list = ()) -> None:
        """Average `weights` in place; `outer=False` (a warm-up's average) skips the outer step.
        `in_full` (an optimizer's state, batch normalization's statistics) is averaged in place in
        the same cycle, always whole and never stepped."""
        compressed = self._compression is not Compression.none
        if self._last is None:
            collectives.grouped_allreduce_([*weights, *in_full], op=Average, name=self.name, process_set=process_set)
        else:
            changes = [w - last for w, last in zip(weights, self._last, strict=True)]
            handles = [collectives.grouped_allreduce_async_(changes, op=Average, name=f"{self.name}.changes",
                                                            compression=self._compression, process_set=process_set)]
            if in_full:
                handles.append(collectives.grouped_allreduce_async_(list(in_full), op=Average,
                                                                    name=f"{self.name}.in_full",
                                                                    process_set=process_set))
            for handle in handles:
                collectives.synchronize(handle)
            for weight, last, change in zip(weights, self._last, changes, strict=True):
                last += change
                weight[...] = last
        moved = False
        if self._outer_step is not None and outer:
            if self._anchors is None:
                self._anchors = [w.copy() for w in weights]
            else:
                self._outer_step(self._anchors, [a - w for a, w in zip(self._anchors, weights, strict=True)])
                for weight, anchor in zip(weights, self._anchors, strict=True):
                    weight[...] = anchor
                moved = True
        if compressed and (self._last is None or moved):
            self._last = [w.copy() for w in weights]
