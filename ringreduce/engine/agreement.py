"""What one rank asked for, as the other ranks see it, and the error when the ranks disagree.

Every rank explains a disagreement with the same words from the same messages, so the same
error is raised on every rank involved.
"""

import math
import typing

from ringreduce.errors import MismatchError, UnsupportedDtypeError, ranks_text
from ringreduce.ops import ReduceOp

# Collectives in which each rank may pass a different first dimension.
RAGGED_KINDS = ("allgather", "alltoall")


class Message(typing.NamedTuple):
    """One rank's request: what must agree across ranks, plus a problem with its arguments.
    (A tuple: one is made for every call, and ranks compare them field by field.)"""

    name: str
    kind: str
    dtype: str | None = None
    shape: tuple = ()
    op: int = -1  # a ReduceOp for the reductions
    root: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    compression: str = "none"
    device: str = "cpu"  # where the arrays live: "cpu" (numpy) or "cuda" (CuPy)
    problem: tuple | None = None  # (exception class name, message) when the arguments were invalid
    site: str = ""  # file:line of the call in the user's code (never compared across ranks)

    def described(self, where=""):
        """"allreduce 'grad' in process set 1 (train.py:12)": the call as errors name it."""
        return f"{self.kind} {self.name!r}{where}" + (f" ({self.site})" if self.site else "")

    @property
    def count(self):
        return math.prod(self.shape)


_PROBLEM_TYPES = {cls.__name__: cls for cls in (TypeError, ValueError, UnsupportedDtypeError)}

# (label, how to show a message's value) for every field the ranks must agree on, once they
# agree on the collective; ragged collectives compare the shape after the first dimension.
_SHAPE = ("shape", lambda m: str(m.shape))
_RAGGED_SHAPE = (("shape after the first dimension", lambda m: str(m.shape[1:])),
                 ("number of dimensions", lambda m: str(len(m.shape))))
_OTHER_FIELDS = (
    ("dtype", lambda m: m.dtype),
    ("op", lambda m: ReduceOp(m.op).name.capitalize() if m.op >= 0 else "none"),
    ("root_rank", lambda m: str(m.root)),
    ("prescale_factor", lambda m: repr(m.prescale)),
    ("postscale_factor", lambda m: repr(m.postscale)),
    ("compression", lambda m: m.compression),
    ("array device", lambda m: m.device),
)


def disagreement(messages, ranks, where=""):
    """None when the ranks' messages for one name fit together, else the error all of them raise,
    which ends with where each rank made the call. `ranks` are the ranks as the user knows them;
    `where` names a process set (" in process set 1")."""
    error = _disagreement(messages, ranks, where)
    if error is not None:
        error.args = (error.args[0] + called_at(messages, ranks),)
    return error


def called_at(messages, ranks):
    """' (called at a.py:3 on rank 0 but b.py:5 on rank 1)', or '' where no call site is known."""
    sites = [m.site or "an unknown place" for m in messages]
    return f" (called at {_spread(sites, ranks)})" if any(m.site for m in messages) else ""


def _disagreement(messages, ranks, where):
    problems = {}  # (type name, text) -> ranks
    for rank, message in zip(ranks, messages, strict=True):
        if message.problem:
            problems.setdefault(message.problem, []).append(rank)
    title = f"{messages[0].kind} {messages[0].name!r}{where}"
    if problems:
        (type_name, text), first_ranks = next(iter(problems.items()))
        if len(problems) == 1:
            detail = f"{title} failed on {ranks_text(first_ranks)}: {text}"
        else:
            detail = f"{title} failed: " + "; ".join(f"{t} (on {ranks_text(r)})" for (_, t), r in problems.items())
        return _PROBLEM_TYPES.get(type_name, ValueError)(detail)
    kinds = [m.kind for m in messages]
    if len(set(kinds)) > 1:
        return MismatchError(f"{title} does not match across ranks: collective {_spread(kinds, ranks)}")
    shape_fields = _RAGGED_SHAPE if kinds[0] in RAGGED_KINDS else (_SHAPE,)
    differences = []
    for label, show in (*shape_fields, *_OTHER_FIELDS):
        shown = [show(m) for m in messages]
        if len(set(shown)) > 1:
            differences.append(f"{label} " + _spread(shown, ranks))
    if not differences:
        return None
    return MismatchError(f"{title} does not match across ranks: " + "; ".join(differences))


def _spread(values, ranks):
    """'a on ranks 0, 2 but b on rank 1': each distinct value with the ranks that gave it."""
    by_value = {}
    for rank, value in zip(ranks, values, strict=True):
        by_value.setdefault(value, []).append(rank)
    return " but ".join(f"{value} on {ranks_text(r)}" for value, r in by_value.items())

