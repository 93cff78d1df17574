"""The reduction operations users name: Horovod's names and values, Average the default.

Without numpy, so that rrun and its per-rank wrapper, which import the package, start without
it (reduction.py applies the ops to arrays).
"""

import enum
import warnings


class ReduceOp(enum.IntEnum):
    """How the ranks' values are combined; the values are Horovod's."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


def as_op(op):
    """Accept a ReduceOp or its integer value; anything else is a clear error."""
    if type(op) is ReduceOp:
        return op
    try:
        return ReduceOp(op)
    except ValueError:
        names = ", ".join(o.name.capitalize() for o in ReduceOp)
        raise ValueError(f"unknown reduction op {op!r}; use one of {names}") from None


def from_average(op, average, stacklevel=3):
    """The op of a call in Horovod's older style: `average=True` is Average and `average=False` is
    Sum (deprecated, with a DeprecationWarning, and an error beside `op`); neither is Average."""
    if average is None:
        return Average if op is None else op
    if op is not None:
        raise ValueError("give op, or the deprecated average, not both")
    warnings.warn("the average argument is deprecated; use op=Average or op=Sum", DeprecationWarning,
                  stacklevel=stacklevel)
    return Average if average else Sum
