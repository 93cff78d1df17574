"""Flat buffers and their parts: where consecutive segments start, even splits, the pieces a
segment travels in, and several arrays seen as one without copying them together."""

import bisect
import itertools


def even_counts(total, parts):
    """`parts` whole numbers that add up to `total` and differ by at most one, larger first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def offsets_of(counts):
    """Where each of consecutive segments of these lengths starts, and where the last ends."""
    return [0, *itertools.accumulate(int(count) for count in counts)]


def pieces(array, chunk_elems):
    """Split a segment into the pieces that are sent as separate messages (at least one)."""
    if len(array) <= chunk_elems:
        return [array]
    return [array[i:i + chunk_elems] for i in range(0, len(array), chunk_elems)]


class Concatenation:
    """Flat arrays of one dtype (at least one array) seen as one, without copying them together:
    `spans` hands out views of the arrays that a range covers, so an algorithm reads, or writes,
    every element where it lies."""

    def __init__(self, parts):
        self.parts = parts
        self.dtype = parts[0].dtype
        self.starts = offsets_of(len(p) for p in parts)

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


def spans(source, start, stop):
    """(offset from `start`, view) covering source[start:stop], for an array or a Concatenation."""
    if isinstance(source, Concatenation):
        return source.spans(start, stop)
    return [(0, source[start:stop])]


def disjoint(arrays):
    """Do these contiguous host arrays occupy separate memory, no byte shared by two of them?"""
    bounds = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays)
    return all(end <= start for (_, end), (start, _) in itertools.pairwise(bounds))
