"""Collectives among the ranks of one host through their shared segment, and the hierarchical
allreduce that joins hosts with a ring among the ranks of the same local rank.

Data crosses the segment in pieces small enough to stay in the last-level cache while the
other ranks read them back (RINGREDUCE_SHM_PIECE_BYTES; docs/performance.md has the sizes
tried): larger pieces fall out of the cache, smaller ones pay more barriers.

Allreduce, per piece: each rank copies the slices the others reduce into its slot, then
reduces its own slice from every rank's slot (its own contribution read in place) into its
slot, then everyone copies all reduced slices out. Every slice is combined in rank order by
exactly one rank, so every rank gets the same bits.
"""

from ringreduce.machine.layout import even_counts, offsets_of, spans
from ringreduce.numerics import reduction


class SharedMemory:
    """Allreduce, reducescatter, allgather and broadcast among the ranks of one host.

    `cross`, for a job on several hosts, is an allreduce among the ranks of the same local
    rank on every host (a ring over MPI): it makes `allreduce` hierarchical.
    """

    # Its allreduce reads and writes a fused group's arrays where they lie (layout.Concatenation).
    reads_concatenation = True
    reduces_any_dtype = True
    adds_in_rank_order = True  # every slice by one rank, in rank order (not the hierarchical form)

    def __init__(self, segment, cross_allreduce=None):
        self.segment = segment
        self.cross_allreduce = cross_allreduce
        if cross_allreduce is not None:
            self.adds_in_rank_order = False  # across hosts, the ring's order too

    def allreduce(self, buf, op, source=None, scale_result=None):
        self._reduce(buf, op, 0, len(buf), buf if source is None else source, scale_result)

    def reducescatter(self, buf, offsets, op, source=None):
        """Reduce every rank's `buf` (or `source`); this rank's segment of `buf` holds the result
        (returned)."""
        rank = self.segment.rank
        self._reduce(buf, op, offsets[rank], offsets[rank + 1], buf if source is None else source)
        return buf[offsets[rank]:offsets[rank + 1]]

    def allgather(self, buf, offsets):
        """Fill every segment of `buf` from the rank that owns it."""
        rank = self.segment.rank
        for start, part, area in self._windows(buf):
            lo, hi = _clip(offsets[rank], offsets[rank + 1], start, len(part))
            area[lo:hi] = part[lo:hi]
            self.segment.barrier()
            part[:lo] = area[:lo]
            part[hi:] = area[hi:]

    def broadcast(self, buf, root, source=None):
        """Every rank's `buf` gets the root's `buf`, or the root's `source` when it has one: then
        the root copies each piece out of the segment too, while the others do."""
        for start, part, area in self._windows(buf):
            if self.segment.rank == root:
                area[:] = part if source is None else source[start:start + len(part)]
            self.segment.barrier()
            if self.segment.rank != root or source is not None:
                part[:] = area

    def _windows(self, buf):
        """(start, piece of buf, data area of its length) for consecutive pieces of `buf`."""
        window = self.segment.area_bytes // buf.dtype.itemsize
        for start in range(0, len(buf), window):
            part = buf[start:start + window]
            yield start, part, self.segment.area(buf.dtype, len(part))

    def _reduce(self, buf, op, keep_start, keep_stop, source, scale_result=None):
        """Reduce `source` over every rank (and host); write the result, after `scale_result` if given,
        into `buf` in [keep_start, keep_stop). Either may be an arrays.Concatenation, and they may
        be the same arrays: each piece is read before the barrier that precedes its writes."""
        combine = reduction.ufunc(op, buf.dtype)
        ranks, rank = self.segment.size, self.segment.rank
        piece = self.segment.area_bytes // ranks // buf.dtype.itemsize
        for start in range(0, len(buf), piece):
            length = min(piece, len(buf) - start)
            slots = self.segment.area(buf.dtype, piece * ranks).reshape(ranks, piece)[:, :length]
            bounds = offsets_of(even_counts(length, ranks))
            for other in range(ranks):
                if other != rank:
                    lo = bounds[other]
                    for offset, view in spans(source, start + lo, start + bounds[other + 1]):
                        slots[rank, lo + offset:lo + offset + len(view)] = view
            self.segment.barrier()
            lo = bounds[rank]
            for offset, view in spans(source, start + lo, start + bounds[rank + 1]):
                mine = slice(lo + offset, lo + offset + len(view))
                reduction.combine_in_rank_order(combine, [view if r == rank else slots[r, mine] for r in range(ranks)],
                                       slots[rank, mine])
            if self.cross_allreduce is not None:
                self.cross_allreduce(slots[rank, lo:bounds[rank + 1]], op)
            if scale_result is not None:
                scale_result(slots[rank, lo:bounds[rank + 1]])
            self.segment.barrier()
            keep_lo, keep_hi = _clip(keep_start, keep_stop, start, length)
            for owner in range(ranks):
                lo, hi = max(bounds[owner], keep_lo), min(bounds[owner + 1], keep_hi)
                for offset, view in spans(buf, start + lo, start + hi):
                    view[...] = slots[owner, lo + offset:lo + offset + len(view)]


def _clip(span_start, span_stop, start, length):
    """The span [span_start, span_stop) of absolute positions, relative to a piece that starts at
    `start` and holds `length` elements, clipped to it (lo == hi when they do not overlap)."""
    lo = min(max(span_start - start, 0), length)
    return lo, min(max(span_stop - start, lo), length)
