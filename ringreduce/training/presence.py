"""Gradients that some ranks have and others do not, one rule for both bindings.

A rank's loss need not touch every parameter: a branch taken on some batches only, a mixture of
experts, an unused head. The rule (torch.distributed DDP's, and Horovod's for torch): a gradient
missing on this rank but present on another takes part as zeros here, dense or sparse as the
others' are, so no rank waits for it and the average counts every rank; a gradient missing on
every rank stays missing (the optimizer skips it, as it would in one process).

Each step the ranks combine one small mask (a plain logical-or allreduce, three flags per
gradient: dense here, sparse here, missing here) before any gradient is combined; only where it
shows a conflict do they gather every rank's flags, to name the ranks in the error.
"""

from collections.abc import Sequence

import numpy as np

from ringreduce import collectives
from ringreduce.errors import ranks_text
from ringreduce.ops import Max
from ringreduce.process_sets import ProcessSet, global_process_set

MISSING, DENSE, SPARSE = 0, 1, 2  # what a rank has of one gradient


def stand_ins(kinds: Sequence[int], labels: Sequence[str], name: str,
              process_set: ProcessSet = global_process_set) -> list[int]:
    """For each gradient, what a rank that lacks it contributes: MISSING where no rank has it (it
    stays missing), else the kind the others have. A gradient dense on some ranks and sparse on
    others is a ValueError on every rank naming it and the ranks."""
    if not len(kinds):
        return []
    dense, sparse, _ = _anywhere(kinds, name, process_set)
    if (dense & sparse).any():
        every = _every_ranks_kinds(kinds, name, process_set)
        index = int(np.flatnonzero(dense & sparse)[0])
        raise ValueError(f"the gradient of {labels[index]} is dense on {_ranks(every, index, process_set, DENSE)} "
                         f"but sparse on {_ranks(every, index, process_set, SPARSE)}; make it dense everywhere "
                         "(sparse_as_dense=True)")
    return [DENSE if d else SPARSE if s else MISSING for d, s in zip(dense, sparse, strict=True)]


def check_all_or_none(kinds: Sequence[int], labels: Sequence[str], name: str,
                      process_set: ProcessSet = global_process_set) -> None:
    """For the paths that cannot stand in for a missing gradient (inside a TensorFlow graph, whose
    inputs are fixed when it is built): a ValueError on every rank, naming the gradients and the
    ranks, unless each gradient is present on every rank or on none."""
    if not len(kinds):
        return
    dense, sparse, missing = _anywhere(kinds, name, process_set)
    partly = np.flatnonzero(missing & (dense | sparse))
    if not len(partly):
        return
    every = _every_ranks_kinds(kinds, name, process_set)
    lacking = "; ".join(f"{labels[i]} (None on {_ranks(every, i, process_set, MISSING)} but not on "
                        f"{_ranks(every, i, process_set, DENSE, SPARSE)})" for i in partly)
    raise ValueError(f"inside a graph, a gradient must be present on every rank or on none: {lacking}; compute the "
                     "gradients eagerly, or make every rank's loss depend on the same variables")


def _anywhere(kinds, name, process_set):
    """(dense on some rank, sparse on some rank, missing on some rank), per gradient."""
    kinds = np.asarray(list(kinds), dtype=np.uint8)
    mine = np.concatenate([kinds == DENSE, kinds == SPARSE, kinds == MISSING])
    anywhere = np.asarray(collectives.allreduce(mine, op=Max, name=name, process_set=process_set))
    return np.split(anywhere, 3)


def _every_ranks_kinds(kinds, name, process_set):
    row = np.asarray([list(kinds)], dtype=np.uint8)
    return np.asarray(collectives.allgather(row, name=f"{name}.every_rank", process_set=process_set))


def _ranks(every, index, process_set, *kinds):
    ranks = process_set.ranks
    return ranks_text([ranks[r] for r in np.flatnonzero(np.isin(every[:, index], kinds))])
