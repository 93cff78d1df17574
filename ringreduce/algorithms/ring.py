"""Ring algorithms: reduce-scatter, allgather, and allreduce as one followed by the other.

Each rank talks only to its two neighbours, so every link carries the same bytes and the
time is 2 (n-1)/n of the data over one link, whatever the number of ranks. Segments
may differ in length (ragged allgather, uneven splits) and may be empty.
"""

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


def reduce_scatter(transport, buf, offsets, combine, scratch, chunk_elems):
    """Combine every rank's `buf` so that segment `rank` of this rank's `buf` holds the result.

    At step s a rank passes on the segment it finished combining at step s-1; each received
    piece is combined while the next is still on the wire.
    """
    n, rank = transport.size, transport.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        outgoing = _segment(buf, offsets, (rank - step - 1) % n)
        mine = _segment(buf, offsets, (rank - step - 2) % n)
        incoming = scratch[:len(mine)]
        receives = [transport.irecv(p, left) for p in pieces(incoming, chunk_elems)]
        sends = [transport.isend(p, right) for p in pieces(outgoing, chunk_elems)]
        for request, target, piece in zip(
            receives, pieces(mine, chunk_elems), pieces(incoming, chunk_elems), strict=True
        ):
            transport.wait([request])
            combine(target, piece, out=target)
        transport.wait(sends)


def allgather(transport, buf, offsets):
    """Fill every segment of `buf` from the rank that owns it (segment r belongs to rank r)."""
    n, rank = transport.size, transport.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        transport.sendrecv(
            _segment(buf, offsets, (rank - step) % n), right,
            _segment(buf, offsets, (rank - step - 1) % n), left,
        )


def allreduce(transport, buf, combine, scratch, chunk_elems, finish=None):
    """`finish`, if given, runs on this rank's fully reduced segment before it is passed on."""
    offsets = offsets_of(even_counts(len(buf), transport.size))
    reduce_scatter(transport, buf, offsets, combine, scratch, chunk_elems)
    if finish is not None:
        finish(_segment(buf, offsets, transport.rank))
    allgather(transport, buf, offsets)


def _segment(buf, offsets, index):
    return buf[offsets[index]:offsets[index + 1]]
