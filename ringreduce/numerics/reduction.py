"""How an op combines arrays, and the scaling around it: prescale multiplies each rank's input
before the reduction, postscale multiplies the result after it, as Horovod's do."""

import numpy as np

from ringreduce.errors import UnsupportedDtypeError
from ringreduce.numerics import kernels
from ringreduce.ops import ReduceOp

_UFUNCS = {
    ReduceOp.AVERAGE: np.add,
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def ufunc(op, dtype=None):
    """The element-wise function that combines two ranks' values (of `dtype`): numpy's, or for a
    narrow float the kernel a binding lent (kernels.py)."""
    return _UFUNCS[op] if dtype is None else kernels.combiner(_UFUNCS[op], op, np.dtype(dtype))


def floating(dtype):
    """Is `dtype` a float: numpy's, or ml_dtypes' bfloat16 (the one "void" dtype that travels)?"""
    return np.dtype(dtype).kind in "fV"


def order_sensitive(op, dtype):
    """Do the result's bits depend on the order in which the ranks' values are combined? For
    float sums and products, yes (floating-point addition is not associative); integers, Min and
    Max are exact in any order."""
    return op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.PRODUCT) and np.dtype(dtype).kind in "fcV"


def combine_in_rank_order(combine, sources, reduced):
    """reduced = sources[0] op sources[1] op ..., left to right: the order every family that adds
    in rank order uses (shared memory, the rank-order family), so they give the same bits."""
    if len(sources) == 1:
        reduced[...] = sources[0]
        return
    combine(sources[0], sources[1], out=reduced)
    for other in sources[2:]:
        combine(reduced, other, out=reduced)


def check_op(op, dtype, prescale_factor=1.0, postscale_factor=1.0):
    """Raise if `op` or the scaling has no meaning for `dtype` (bool supports only Min/Max/Product)."""
    if op == ReduceOp.ADASUM:
        raise ValueError("Adasum is not offered by ringreduce; use Average (or Sum)")
    if dtype == np.bool_:
        if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
            raise UnsupportedDtypeError(
                f"{op.name.capitalize()} is not defined for bool arrays; "
                "use Min (logical and), Max (logical or) or Product"
            )
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise UnsupportedDtypeError("bool arrays cannot be scaled")


def scale(source, factor, out=None):
    """out = source * factor in out's dtype (in place without `out`), computed as Horovod computes
    it, so that scaled results agree with Horovod's bit for bit: float16 and float32 in float32
    (the factor rounded to float32), float64 and integers in float64, integer results truncated
    toward zero as a C cast does. The cast to and from a compressed wire dtype happens here too."""
    target = source if out is None else out
    if factor != 1.0:
        single = source.dtype.kind == "f" and source.dtype.itemsize <= 4
        np.multiply(source, factor, out=target, dtype=np.float32 if single else np.float64, casting="unsafe")
    elif target is not source:
        kernels.cast_into(target, source)


def scale_result(array, op, size, postscale_factor=1.0, out=None):
    """Turn a reduced sum into the op's result: in place, or into `out`, an array of its dtype (the
    copy out of a work buffer in the same pass, the same bits). Average of floats is one
    multiplication by postscale / size, as Horovod's (one rounding); integer averages are truncated
    toward zero, as Horovod's (-33 / 2 is -16), in integers, so exact for every int64, then
    postscaled."""
    if op == ReduceOp.AVERAGE and np.issubdtype(array.dtype, np.integer):
        if out is not None:
            np.copyto(out, array)
            array = out
        np.subtract(array, np.fmod(array, size), out=array)  # a multiple of size, toward zero
        np.floor_divide(array, size, out=array)
        scale(array, postscale_factor)
    else:
        scale(array, postscale_factor / size if op == ReduceOp.AVERAGE else postscale_factor, out=out)


def identity(op, dtype):
    """What a joined rank contributes: the value that leaves the others' result unchanged."""
    dtype = np.dtype(dtype)
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        return 0
    if op == ReduceOp.PRODUCT:
        return 1
    if dtype == np.bool_:
        return op == ReduceOp.MIN
    if floating(dtype):
        return np.inf if op == ReduceOp.MIN else -np.inf
    info = np.iinfo(dtype)
    return info.max if op == ReduceOp.MIN else info.min

