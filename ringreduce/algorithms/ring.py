"""Ring algorithms: reduce-scatter, allgather, and allreduce as one followed by the other.

Each rank talks only to its two neighbours, so every link carries the same bytes and the
time is 2 (n-1)/n of the data over one link, whatever the number of ranks. Segments
may differ in length (ragged allgather, uneven splits) and may be empty.
"""

from ringreduce.machine.layout import even_counts, offsets_of, pieces


def reduce_scatter(transport, buf, offsets, combine, scratch, chunk_elems):
    """Combine every rank's `buf` so that segment `rank` of this rank's `buf` holds the result.

    At step s a rank passes on the segment it finished combining at step s-1; each received
    piece is combined while the next is still on the wire.
    """
    n, rank = transport.size, transport.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        exchange_and_combine(transport, _segment(buf, offsets, (rank - step - 1) % n), right,
                             _segment(buf, offsets, (rank - step - 2) % n), left, combine, scratch, chunk_elems)


def exchange_and_combine(transport, outgoing, dest, mine, source, combine, scratch, chunk_elems):
    """Send `outgoing` (if any) to `dest` while `source`'s copy of the elements of `mine` arrives
    (into `scratch`) and is combined into `mine`, each piece while the next is still on the wire."""
    incoming = scratch[:len(mine)]
    receives = [transport.irecv(p, source) for p in pieces(incoming, chunk_elems)]
    sends = [] if outgoing is None else [transport.isend(p, dest) for p in pieces(outgoing, chunk_elems)]
    for request, target, piece in zip(receives, pieces(mine, chunk_elems), pieces(incoming, chunk_elems), strict=True):
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


def allreduce(transport, buf, combine, scratch, chunk_elems, scale_result=None):
    """`scale_result`, if given, runs on this rank's fully reduced segment before it is passed on."""
    offsets = offsets_of(even_counts(len(buf), transport.size))
    reduce_scatter(transport, buf, offsets, combine, scratch, chunk_elems)
    if scale_result is not None:
        scale_result(_segment(buf, offsets, transport.rank))
    allgather(transport, buf, offsets)


def _segment(buf, offsets, index):
    return buf[offsets[index]:offsets[index + 1]]
