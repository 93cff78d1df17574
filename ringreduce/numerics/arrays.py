"""The arrays the public calls take: numpy on the CPU, CuPy on the GPU, of the dtypes that can
travel; the checks that turn anything else into a clear error before it reaches the engine."""

from typing import Any, TypeAlias

import numpy as np

from ringreduce.errors import UnsupportedDtypeError
from ringreduce.machine.backends import module_of, on_device
from ringreduce.numerics import device_kernels

# What the calls give back: a numpy.ndarray, or a cupy.ndarray where the input was one (CuPy is
# not a dependency, so its type is not named here).
Array: TypeAlias = np.ndarray | Any

SUPPORTED_DTYPES = tuple(
    np.dtype(t)
    for t in (np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64,
              np.float16, np.float32, np.float64)
)
# dtype -> name, as the messages carry it (numpy works a dtype's name out anew at every ask).
DTYPE_NAMES = {dtype: dtype.name for dtype in SUPPORTED_DTYPES}
# GPU arrays may also be bfloat16 (ml_dtypes' dtype, which CuPy 14 takes): they travel as
# themselves where the GPU runs bfloat16 kernels (NCCL has the type). numpy arrays may not: the
# host path would compute on them at a fraction of float32's speed (numerics/kernels.py).
DEVICE_ONLY = "bfloat16"


def dtype_name(dtype):
    """The name a message carries for a checked array's dtype."""
    return DTYPE_NAMES.get(dtype) or dtype.name


def as_array(value):
    """Any array-like as a numpy array, without copying one that already is (or a CuPy array)."""
    return value if isinstance(value, np.ndarray) or on_device(value) else np.asarray(value)


def check_dtype(array):
    if array.dtype in DTYPE_NAMES:
        return
    names = ", ".join(d.name for d in SUPPORTED_DTYPES)
    if array.dtype.name != DEVICE_ONLY:
        raise UnsupportedDtypeError(f"dtype {array.dtype} is not supported; use one of {names}")
    if not on_device(array):
        raise UnsupportedDtypeError(f"bfloat16 travels only as GPU (CuPy) arrays; on the CPU use one of {names} "
                                    "(Compression.bf16 sends float arrays as bfloat16)")
    require_device_bfloat16(array, "a bfloat16 GPU array")


def require_device_bfloat16(array, what):
    """Raise unless bfloat16 can travel on the GPU of device array `array` (asked once)."""
    with array.device:
        why = device_kernels.bfloat16_unavailable(module_of(array))
    if why is not None:
        raise UnsupportedDtypeError(f"{what} needs bfloat16 on the GPU (CuPy 14 with ml_dtypes, CUDA 12.2 or "
                                    f"later): {why}")


def writable_in_place(array, what):
    """Check that an in-place call can write its result straight into `array`."""
    if not isinstance(array, np.ndarray) and not on_device(array):
        raise TypeError(f"{what} needs a numpy or CuPy array, got {type(array).__name__}")
    if not getattr(array.flags, "writeable", True):
        raise ValueError(f"{what} cannot write into a read-only array; use the out-of-place form")
    if not array.flags.c_contiguous:
        raise ValueError(f"{what} needs a C-contiguous array; use the out-of-place form")
    return array
