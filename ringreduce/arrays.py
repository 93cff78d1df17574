"""The array backend: which arrays the core accepts and the scratch memory it reuses.

numpy on the CPU for now; everything above this module sees plain contiguous arrays.
"""

import numpy as np

from ringreduce.errors import UnsupportedDtypeError

# Position + 1 is the dtype's code in the records the ranks compare (0: not supported).
SUPPORTED_DTYPES = tuple(
    np.dtype(t)
    for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
              np.float16, np.float32, np.float64)
)


def as_array(value):
    """Any array-like as a numpy array, without copying one that already is."""
    return value if isinstance(value, np.ndarray) else np.asarray(value)


def check_dtype(array):
    if array.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise UnsupportedDtypeError(f"dtype {array.dtype} is not supported; use one of {names}")


def dtype_code(dtype):
    return SUPPORTED_DTYPES.index(dtype) + 1 if dtype in SUPPORTED_DTYPES else 0


def dtype_from_code(code):
    return SUPPORTED_DTYPES[code - 1]


def fresh_copy(array):
    """A new C-contiguous array with `array`'s values: the one copy an out-of-place call makes.

    It also makes non-contiguous and read-only inputs safe to communicate.
    """
    return np.array(array, order="C", copy=True)


def writable_in_place(array, what):
    """Check that an in-place call can write its result straight into `array`."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what} needs a numpy array, got {type(array).__name__}")
    if not array.flags.writeable:
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
