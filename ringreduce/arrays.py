"""The array backends: numpy on the CPU, CuPy on the GPU, and the scratch memory the core reuses.

A CuPy array arrives as it is (a CUDA torch tensor reaches one by DLPack, without a copy);
the engine runs its collectives on the GPU (device_execution.py). Nothing here imports CuPy:
arrays are told apart by their type's module.
"""

import bisect
import itertools
import math
import sys
import threading

import numpy as np

from ringreduce.errors import UnsupportedDtypeError

SUPPORTED_DTYPES = tuple(
    np.dtype(t)
    for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
              np.float16, np.float32, np.float64)
)
# dtype -> name, as the messages carry it (numpy works a dtype's name out anew at every ask).
DTYPE_NAMES = {dtype: dtype.name for dtype in SUPPORTED_DTYPES}


def as_array(value):
    """Any array-like as a numpy array, without copying one that already is (or a CuPy array)."""
    return value if isinstance(value, np.ndarray) or on_device(value) else np.asarray(value)


def on_device(array):
    """A CuPy array? (Told without importing CuPy, which is slow and may have no GPU to use.)"""
    return type(array) is not np.ndarray and type(array).__module__.split(".")[0] == "cupy"


def device_of(array):
    """Where an array lives, as the ranks compare it: "cuda" for CuPy, else "cpu"."""
    return "cuda" if on_device(array) else "cpu"


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
    if array.dtype not in DTYPE_NAMES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise UnsupportedDtypeError(f"dtype {array.dtype} is not supported; use one of {names}")


def device_copy(array):
    """A new C-contiguous copy of a CuPy array, on its GPU."""
    return module_of(array).array(array, order="C", copy=True)


def new_like(array, shape=None):
    """An uninitialized result of `array`'s kind and dtype (host results come from RECYCLER)."""
    shape = array.shape if shape is None else shape
    if on_device(array):
        return module_of(array).empty(shape, dtype=array.dtype)
    return RECYCLER.empty(shape, array.dtype)


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
    fresh pages on its hot path. `allocate(nbytes)` gives a flat uint8 array: host memory by
    default; device or pinned host memory for the GPU paths."""

    def __init__(self, allocate=lambda nbytes: np.empty(nbytes, dtype=np.uint8)):
        self._allocate = allocate
        self._buffer = None

    def get(self, count, dtype):
        nbytes = count * np.dtype(dtype).itemsize
        if self._buffer is None or self._buffer.nbytes < nbytes:
            self._buffer = self._allocate(nbytes)
        return self._buffer[:nbytes].view(dtype)


class Concatenation:
    """Flat arrays of one dtype (at least one array) seen as one, without copying them together:
    `spans` hands out views of the arrays that a range covers, so an algorithm reads, or writes,
    every element where it lies."""

    def __init__(self, parts):
        self.parts = parts
        self.dtype = parts[0].dtype
        self.starts = [0, *np.cumsum([len(p) for p in parts]).tolist()]

    def __len__(self):
        return self.starts[-1]

    @property
    def nbytes(self):
        return self.starts[-1] * self.dtype.itemsize

    def spans(self, start, stop):
        """(offset from `start`, view) for each stretch of [start, stop) that lies in one array."""
        index = max(bisect.bisect_right(self.starts, start) - 1, 0)
        while index < len(self.parts) and self.starts[index] < stop:
            begin = self.starts[index]
            lo, hi = max(start, begin), min(stop, self.starts[index + 1])
            if lo < hi:
                yield lo - start, self.parts[index][lo - begin:hi - begin]
            index += 1


def disjoint(arrays):
    """Do these contiguous host arrays occupy separate memory, no byte shared by two of them?"""
    bounds = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays)
    return all(end <= start for (_, end), (start, _) in itertools.pairwise(bounds))


def spans(source, start, stop):
    """(offset from `start`, view) covering source[start:stop], for an array or a Concatenation."""
    if isinstance(source, Concatenation):
        return source.spans(start, stop)
    return [(0, source[start:stop])]


class Recycler:
    """New host arrays for large results, carved from blocks that earlier results have let go.

    A freshly allocated array's pages fault on first touch, and on this kind of machine that
    costs more than the collective: a 64 MiB allreduce into a fresh array took 31 ms against
    13 ms into one allocated before. A block is free again when nothing but this recycler
    refers to it (a result, and every view of it, keeps its block referenced), which CPython's
    reference count tells exactly. Smaller arrays come from numpy, whose allocator reuses
    memory well at those sizes.
    """

    MIN_BYTES = 1 << 20

    def __init__(self, keep=8):
        self.keep = keep
        self._blocks = []  # the most recently handed out last
        self._lock = threading.Lock()

    def empty(self, shape, dtype):
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.MIN_BYTES:
            return np.empty(shape, dtype)
        with self._lock:
            block = self._take(nbytes)
            self._blocks.append(block)
            del self._blocks[:-self.keep]
        return block[:nbytes].view(dtype).reshape(shape)

    def _take(self, nbytes):
        """The smallest free block that fits without wasting more than half of it, out of the list;
        or a new one."""
        free = [i for i in range(len(self._blocks))
                if nbytes <= self._blocks[i].nbytes <= 2 * nbytes and _unreferenced(self._blocks[i])]
        if not free:
            return np.empty(nbytes, dtype=np.uint8)
        return self._blocks.pop(min(free, key=lambda i: self._blocks[i].nbytes))


def _unreferenced(block):
    # References: the recycler's list, this function's argument, and getrefcount's own.
    return sys.getrefcount(block) <= 3


RECYCLER = Recycler()
