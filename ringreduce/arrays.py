"""The array backends: numpy on the CPU, CuPy on the GPU, and the scratch memory the core reuses.

The collectives run on host buffers. A CuPy array is staged through them: converted (and,
with compression, cast) on the GPU, then copied to the host; results come back the same way,
so casts and scaling run on the GPU and only the wire's bytes cross the PCIe bus.
"""

import numpy as np

from ringreduce.errors import UnsupportedDtypeError

SUPPORTED_DTYPES = tuple(
    np.dtype(t)
    for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
              np.float16, np.float32, np.float64)
)


def as_array(value):
    """Any array-like as a numpy array, without copying one that already is (or a CuPy array)."""
    return value if isinstance(value, np.ndarray) or on_device(value) else np.asarray(value)


def on_device(array):
    """A CuPy array? (Told without importing CuPy, which is slow and may have no GPU to use.)"""
    return type(array).__module__.split(".")[0] == "cupy"


def module_of(array):
    """numpy, or cupy for a CuPy array: the functions that create arrays like this one."""
    if on_device(array):
        import cupy

        return cupy
    return np


def to_host(array):
    return array.get() if on_device(array) else array


def like(host, model):
    """`host` as an array of the same kind as `model` (copied to the GPU for a CuPy model)."""
    return module_of(model).asarray(host) if on_device(model) else host


def check_dtype(array):
    if array.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise UnsupportedDtypeError(f"dtype {array.dtype} is not supported; use one of {names}")


def fresh_copy(array):
    """A new C-contiguous array with `array`'s values: the one copy an out-of-place call makes.

    It also makes non-contiguous and read-only inputs safe to communicate.
    """
    return module_of(array).array(array, order="C", copy=True)


def writable_in_place(array, what):
    """Check that an in-place call can write its result straight into `array`."""
    if not isinstance(array, np.ndarray) and not on_device(array):
        raise TypeError(f"{what} needs a numpy or CuPy array, got {type(array).__name__}")
    if not getattr(array.flags, "writeable", True):
        raise ValueError(f"{what} cannot write into a read-only array; use the out-of-place form")
    if not array.flags.c_contiguous:
        raise ValueError(f"{what} needs a C-contiguous array; use the out-of-place form")
    return array


class Workspace:
    """Scratch memory allocated once and grown when needed, so a collective never first-touches
    fresh pages on its hot path."""

    def __init__(self):
        self._buffer = np.empty(0, dtype=np.uint8)

    def get(self, count, dtype):
        nbytes = count * np.dtype(dtype).itemsize
        if self._buffer.nbytes < nbytes:
            self._buffer = np.empty(nbytes, dtype=np.uint8)
        return self._buffer[:nbytes].view(dtype)
