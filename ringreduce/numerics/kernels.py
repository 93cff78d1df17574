"""The element-wise kernels of the wire's narrow floats (float16, bfloat16), which a binding may
lend the core.

Why: on one core of the test machine numpy casts float32 to float16 at 0.42 G values/s and adds
float16 arrays at 0.27 G (ml_dtypes' bfloat16: 0.39 G and 0.76 G), where a float32 copy runs at
1.8 G, so on the CPU Compression.fp16 and bf16 cost more time than the bytes they save. torch's
kernels give the same results bit for bit at 1.6-2.4 G (casts) and 1.7-2.0 G (sums). The core
imports no framework: ringreduce.torch lends torch's when it is imported (`lend`); otherwise, and
for every array they do not take, numpy's run.
"""

from collections.abc import Callable
from typing import Protocol

import numpy as np


class Kernels(Protocol):
    """What a binding lends: cast(target, source) casts into target and returns False where it does
    not take those arrays; combiner(ufunc, op, dtype) returns a function called as numpy's ufuncs
    are (a, b, out=None), that runs `ufunc` on the arrays it does not take."""

    def cast(self, target: np.ndarray, source: np.ndarray) -> bool: ...

    def combiner(self, ufunc: np.ufunc, op: int, dtype: np.dtype) -> Callable[..., np.ndarray]: ...


_lent: Kernels | None = None


def lend(kernels: Kernels | None) -> None:
    """Use `kernels` from now on (None: numpy's again)."""
    global _lent
    _lent = kernels


def cast_into(target, source):
    """source's values into target, cast to target's dtype as numpy's unsafe casting does."""
    if _lent is None or target.dtype == source.dtype or not _lent.cast(target, source):
        np.copyto(target, source, casting="unsafe")


def combiner(ufunc, op, dtype):
    """What combines two ranks' arrays of `dtype` under `op`: for a narrow float, the lent kernel
    (which falls back on `ufunc`, numpy's, for arrays it does not take), else `ufunc`."""
    if _lent is None or dtype.itemsize != 2 or dtype.kind not in "fV":
        return ufunc
    return _lent.combiner(ufunc, op, dtype)
