"""torch's kernels for the wire's narrow floats, lent to the core when ringreduce.torch is imported
(ringreduce/numerics/kernels.py says why): casts between float32 and float16 or bfloat16, and Sum, Average and
Product of float16 and bfloat16 arrays, on numpy arrays through zero-copy torch views. They run on torch's
intra-op threads (torch.set_num_threads)."""

import numpy as np

import torch
from ringreduce import ops
from ringreduce.numerics import compression

# Min and Max stay numpy's: torch's pick the other of two zeros of different signs.
_COMBINE = {ops.Sum: torch.add, ops.Average: torch.add, ops.Product: torch.mul}
_FLOAT16, _FLOAT32 = np.dtype(np.float16), np.dtype(np.float32)


def _narrow(dtype):
    """torch's dtype for a narrow float numpy dtype, else None. ml_dtypes' bfloat16 is looked up only
    for a dtype numpy does not know itself (kind V), so that importing ringreduce.torch does not
    import ml_dtypes."""
    if dtype == _FLOAT16:
        return torch.float16
    if dtype.kind == "V" and dtype == compression.bfloat16():
        return torch.bfloat16
    return None


def _view(array):
    """A torch tensor sharing `array`'s memory, or None where torch cannot (or should not) take it:
    read-only, negative or uneven strides, or a dtype other than float32 and the narrow floats."""
    if not isinstance(array, np.ndarray) or not array.flags.writeable:
        return None
    if any(stride < 0 or stride % array.itemsize for stride in array.strides):
        return None
    if array.dtype == _FLOAT32:
        return torch.from_numpy(array)
    narrow = _narrow(array.dtype)
    if narrow is None:
        return None
    return torch.from_numpy(array.view(np.int16)).view(narrow)


class TorchKernels:
    """What ringreduce.numerics.kernels.lend takes."""

    @staticmethod
    def cast(target, source):
        if target.shape != source.shape or _FLOAT32 not in (target.dtype, source.dtype):
            return False  # float64's casts stay numpy's: torch rounds them through float32
        into, values = _view(target), _view(source)
        if into is None or values is None:
            return False
        into.copy_(values)
        return True

    @staticmethod
    def combiner(ufunc, op, dtype):
        torch_op = _COMBINE.get(op)
        if torch_op is None:
            return ufunc

        def combine(a, b, out=None):
            if out is None:
                out = np.empty(np.shape(a), dtype)
            views = [_view(array) for array in (a, b, out)]
            if None in views or not np.shape(a) == np.shape(b) == out.shape or not a.dtype == b.dtype == dtype:
                return ufunc(a, b, out=out)
            torch_op(views[0], views[1], out=views[2])
            return out

        return combine
