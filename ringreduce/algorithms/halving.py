"""Recursive halving and doubling: allreduce as a reduce-scatter by recursive halving followed by
an allgather by recursive doubling (Rabenseifner's algorithm), and allgather by doubling alone.

Among a power of two of ranks, step k pairs each rank with the one whose number differs in bit
k: log2(n) steps each way, against the ring's n-1, for the same bytes per rank (2 (n-1)/n of
the array). A rank count that is not a power of two is folded first: of the first 2r ranks
(r = n minus the largest power of two below it), each even one hands its data to the odd one
above it and sits out; the odd one hands the result back at the end.

Every segment of the result is combined by one rank and then copied, so every rank gets the
same bits.
"""

from ringreduce.algorithms.ring import exchange_and_combine
from ringreduce.machine.layout import even_counts, offsets_of, pieces


class Fold:
    """Which ranks take part in the power-of-two exchange, and under which numbers."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size
        self.width = 1 << (size.bit_length() - 1)  # the largest power of two <= size
        self.extra = size - self.width
        folded = rank < 2 * self.extra
        # A folded even rank sits out; its odd partner, one above, takes part for both.
        self.sits_out = folded and rank % 2 == 0
        self.partner = (rank + 1 if rank % 2 == 0 else rank - 1) if folded else None
        self.number = rank // 2 if folded else rank - self.extra

    def real(self, number):
        """The rank that takes part under `number`."""
        return 2 * number + 1 if number < self.extra else number + self.extra

    def first_rank(self, number):
        """The lowest rank whose data `number` stands for (itself, or the even rank folded into it)."""
        return 2 * number if number < self.extra else number + self.extra


def allreduce(transport, buf, combine, scratch, chunk_elems, scale_result=None):
    """`scratch` holds len(buf) elements. `scale_result`, if given, runs on each rank's reduced
    segment before the doubling passes it on."""
    fold = Fold(transport.rank, transport.size)
    if fold.sits_out:
        transport.wait([transport.isend(p, fold.partner) for p in pieces(buf, chunk_elems)])
    elif fold.partner is not None:
        exchange_and_combine(transport, None, None, buf, fold.partner, combine, scratch, chunk_elems)
    if not fold.sits_out:
        offsets = offsets_of(even_counts(len(buf), fold.width))
        _halve(transport, fold, buf, offsets, combine, scratch, chunk_elems)
        if scale_result is not None:
            scale_result(buf[offsets[fold.number]:offsets[fold.number + 1]])
        _double(transport, fold, buf, offsets)
    _unfold(transport, fold, buf, chunk_elems)


def allgather(transport, buf, offsets):
    """Fill every segment of `buf` from the rank that owns it (segment r belongs to rank r;
    segments may be ragged or empty). A folded pair's segments are neighbours, so each rank that
    takes part holds one contiguous stretch throughout."""
    fold = Fold(transport.rank, transport.size)
    if fold.partner is not None:
        mine = buf[offsets[fold.rank]:offsets[fold.rank + 1]]
        if fold.sits_out:
            transport.wait([transport.isend(mine, fold.partner)])
        else:
            theirs = buf[offsets[fold.partner]:offsets[fold.partner + 1]]
            transport.wait([transport.irecv(theirs, fold.partner)])
    if not fold.sits_out:
        stretches = [offsets[fold.first_rank(number)] for number in range(fold.width)] + [offsets[-1]]
        _double(transport, fold, buf, stretches)
    _unfold(transport, fold, buf, 1 << 62)


def _halve(transport, fold, buf, offsets, combine, scratch, chunk_elems):
    """Reduce-scatter by recursive halving: afterwards segment `fold.number` holds the result."""
    lo, hi = 0, fold.width
    distance = fold.width // 2
    while distance >= 1:
        partner = fold.real(fold.number ^ distance)
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if fold.number & distance == 0 else ((mid, hi), (lo, mid))
        exchange_and_combine(transport, buf[offsets[give[0]]:offsets[give[1]]], partner,
                             buf[offsets[keep[0]]:offsets[keep[1]]], partner, combine, scratch, chunk_elems)
        lo, hi = keep
        distance //= 2


def _double(transport, fold, buf, offsets):
    """Allgather by recursive doubling of the stretches [offsets[i], offsets[i + 1]), where
    stretch i is held by participant i."""
    distance = 1
    while distance < fold.width:
        start = fold.number // distance * distance
        other = start ^ distance
        transport.sendrecv(buf[offsets[start]:offsets[start + distance]], fold.real(fold.number ^ distance),
                           buf[offsets[other]:offsets[other + distance]], fold.real(fold.number ^ distance))
        distance *= 2


def _unfold(transport, fold, buf, chunk_elems):
    """Each folded odd rank hands the whole result to the even rank that sat out."""
    if fold.partner is None:
        return
    if fold.sits_out:
        transport.wait([transport.irecv(p, fold.partner) for p in pieces(buf, chunk_elems)])
    else:
        transport.wait([transport.isend(p, fold.partner) for p in pieces(buf, chunk_elems)])
