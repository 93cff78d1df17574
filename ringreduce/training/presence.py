"""Gradients that some ranks have and others do not, one rule for both bindings.

A rank's loss need not touch every parameter: a branch taken on some batches only, a mixture of
experts, an unused head. The rule (torch.distributed DDP's, and Horovod's for torch): a gradient
missing on this rank but present on another takes part as zeros here, dense or sparse as the
others' are, so no rank waits for it and the average counts every rank; a gradient missing on
every rank stays missing (the optimizer skips it, as it would in one process).

Each step the ranks exchange one small row saying what kind of gradient each has (one
allgather of a few bytes per gradient), fused with nothing else, before any gradient is
combined.
"""

from collections.abc import Sequence

import numpy as np

from ringreduce import collectives
from ringreduce.errors import ranks_text
from ringreduce.process_sets import ProcessSet, global_process_set

MISSING, DENSE, SPARSE = 0, 1, 2  # what a rank has of one gradient


def exchanged(kinds: Sequence[int], name: str, process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Every rank's kinds (MISSING, DENSE or SPARSE per gradient), a row per rank of `process_set`."""
    row = np.asarray([list(kinds)], dtype=np.uint8)
    return np.asarray(collectives.allgather(row, name=name, process_set=process_set))


def stand_ins(matrix: np.ndarray, labels: Sequence[str], process_set: ProcessSet = global_process_set) -> list[int]:
    """For each gradient, what a rank that lacks it contributes: MISSING where no rank has it (it
    stays missing), else the kind the others have. A gradient dense on some ranks and sparse on
    others is a ValueError naming it and the ranks (the same on every rank)."""
    ranks = process_set.ranks
    plan = []
    for index, column in enumerate(matrix.T):
        kinds = set(column.tolist()) - {MISSING}
        if len(kinds) > 1:
            dense = [ranks[r] for r in np.flatnonzero(column == DENSE)]
            sparse = [ranks[r] for r in np.flatnonzero(column == SPARSE)]
            raise ValueError(f"the gradient of {labels[index]} is dense on {ranks_text(dense)} but sparse on "
                             f"{ranks_text(sparse)}; make it dense everywhere (sparse_as_dense=True)")
        plan.append(kinds.pop() if kinds else MISSING)
    return plan


def missing_here(matrix: np.ndarray, labels: Sequence[str], process_set: ProcessSet = global_process_set) -> str:
    """'w (rank 1 has none; ranks 0, 2 have it)', for gradients that some ranks lack: the errors of
    the paths that cannot stand in for them (inside a TensorFlow graph, whose inputs are fixed
    when it is built)."""
    ranks = process_set.ranks
    parts = []
    for index, column in enumerate(matrix.T):
        if MISSING in column and (column != MISSING).any():
            lacking = [ranks[r] for r in np.flatnonzero(column == MISSING)]
            having = [ranks[r] for r in np.flatnonzero(column != MISSING)]
            parts.append(f"{labels[index]} (None on {ranks_text(lacking)} but not on {ranks_text(having)})")
    return "; ".join(parts)
