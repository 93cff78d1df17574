"""How the ranks check, before moving any data, that they called the same collective with
arguments that fit together.

Each rank encodes what it was asked to do as a short row of integers; one small allgather
gives every rank every row, and every rank runs the same comparison on the same rows, so
they all raise the same error or none does. Only on that error path are the readable
details (names, messages) gathered as well.
"""

import dataclasses
import zlib

import numpy as np

from ringreduce import arrays
from ringreduce.errors import MismatchError, UnsupportedDtypeError
from ringreduce.ops import ReduceOp

KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier")
# Collectives in which each rank may pass a different first dimension.
RAGGED_KINDS = ("allgather", "alltoall")
MAX_NDIM = 32

KIND, NAME, DTYPE, OP, ROOT, PROBLEM, NDIM, SHAPE = range(8)
RECORD_LENGTH = SHAPE + MAX_NDIM


@dataclasses.dataclass(frozen=True)
class Signature:
    """What one rank passed, as far as the other ranks must agree with it."""

    dtype: np.dtype | None = None
    shape: tuple = ()
    op: int = -1
    root: int = -1

    @classmethod
    def of(cls, array, op=-1, root=-1):
        if array.ndim > MAX_NDIM:
            raise ValueError(f"arrays of more than {MAX_NDIM} dimensions are not supported")
        return cls(array.dtype, array.shape, int(op), int(root))


def record(kind, name, signature, problem):
    """The row of integers that stands for one rank's call."""
    row = np.zeros(RECORD_LENGTH, dtype=np.int64)
    row[KIND] = KINDS.index(kind)
    row[NAME] = zlib.crc32((name or "").encode())
    row[PROBLEM] = problem is not None
    if signature is not None:
        row[DTYPE] = arrays.dtype_code(signature.dtype)
        row[OP] = signature.op
        row[ROOT] = signature.root
        row[NDIM] = len(signature.shape)
        row[SHAPE:SHAPE + len(signature.shape)] = signature.shape
    return row


def disagrees(rows):
    """True when the rows cannot be one collective: some rank had a problem or a field differs."""
    if rows[:, PROBLEM].any():
        return True
    compared = rows if KINDS[rows[0, KIND]] not in RAGGED_KINDS else np.delete(rows, SHAPE, axis=1)
    return bool((compared != compared[0]).any())


@dataclasses.dataclass(frozen=True)
class Description:
    """The readable form of one rank's call, gathered only to explain a disagreement."""

    kind: str
    name: str | None
    signature: Signature | None
    problem: tuple | None  # (exception class name, message)


_PROBLEM_TYPES = {cls.__name__: cls for cls in (TypeError, ValueError, UnsupportedDtypeError)}


def explain(descriptions):
    """The exception every rank raises for these disagreeing calls (index = rank)."""
    problems = {}  # (type name, message) -> ranks
    for rank, description in enumerate(descriptions):
        if description.problem:
            problems.setdefault(description.problem, []).append(rank)
    if problems:
        (type_name, message), ranks = next(iter(problems.items()))
        title = _title(descriptions[ranks[0]])
        if len(problems) == 1:
            text = f"{title} failed on {_ranks(ranks)}: {message}"
        else:
            text = f"{title} failed: " + "; ".join(f"{m} (on {_ranks(r)})" for (_, m), r in problems.items())
        return _PROBLEM_TYPES.get(type_name, ValueError)(text)
    kinds = [d.kind for d in descriptions]
    if len(set(kinds)) > 1:
        return MismatchError("the ranks called different collectives: " + _spread(kinds))
    differences = []
    names = [d.name for d in descriptions]
    if len(set(names)) > 1:
        differences.append("name " + _spread([repr(n) for n in names]))
    signatures = [d.signature for d in descriptions]
    fields = [("dtype", lambda s: str(s.dtype))]
    if kinds[0] in RAGGED_KINDS:
        fields.append(("shape after the first dimension", lambda s: str(s.shape[1:])))
        fields.append(("number of dimensions", lambda s: str(len(s.shape))))
    else:
        fields.append(("shape", lambda s: str(s.shape)))
    fields.append(("op", lambda s: _op_name(s.op)))
    fields.append(("root_rank", lambda s: str(s.root)))
    for label, show in fields:
        shown = [show(s) for s in signatures]
        if len(set(shown)) > 1:
            differences.append(f"{label} " + _spread(shown))
    return MismatchError(
        f"{_title(descriptions[0])} does not match across ranks: " + "; ".join(differences)
    )


def _title(description):
    return description.kind + (f" {description.name!r}" if description.name else "")


def _op_name(op):
    return ReduceOp(op).name.capitalize() if op >= 0 else "none"


def _spread(values):
    """'a on ranks 0, 2 but b on rank 1': each distinct value with the ranks that gave it."""
    by_value = {}
    for rank, value in enumerate(values):
        by_value.setdefault(value, []).append(rank)
    return " but ".join(f"{value} on {_ranks(ranks)}" for value, ranks in by_value.items())


def _ranks(ranks):
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
