"""Memory the core reuses: scratch buffers grown once, and blocks recycled for large results.

A freshly allocated array's pages fault on first touch, which on a memory-bound collective can
cost more than the collective itself (docs/performance.md has the figures): the hot paths work
in memory that has been touched before.
"""

import math
import sys
import threading

import numpy as np


class Workspace:
    """Scratch memory allocated once and grown when needed. `allocate(nbytes)` gives a flat uint8
    array: host memory by default; device or pinned host memory for the GPU paths."""

    def __init__(self, allocate=lambda nbytes: np.empty(nbytes, dtype=np.uint8)):
        self._allocate = allocate
        self._buffer = None

    def get(self, count, dtype):
        nbytes = count * np.dtype(dtype).itemsize
        if self._buffer is None or self._buffer.nbytes < nbytes:
            self._buffer = self._allocate(nbytes)
        return self._buffer[:nbytes].view(dtype)


class Recycler:
    """New host arrays for large results, carved from blocks that earlier results have let go.

    A block is free again when nothing but this recycler refers to it (a result, and every view
    of it, keeps its block referenced), which CPython's reference count tells exactly. Smaller
    arrays come from numpy, whose allocator reuses memory well at those sizes.
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
        or a new one. (One pass, no lists made: a result of 1 MiB or more takes one of these.)"""
        best, best_bytes = None, 2 * nbytes + 1
        for index in range(len(self._blocks)):
            block = self._blocks[index]
            # Free: referred to by the list, `block` and getrefcount's argument only.
            if nbytes <= block.nbytes < best_bytes and sys.getrefcount(block) <= 3:
                best, best_bytes = index, block.nbytes
        return np.empty(nbytes, dtype=np.uint8) if best is None else self._blocks.pop(best)


RECYCLER = Recycler()
