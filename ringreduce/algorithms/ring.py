"""Ring algorithms: reduce-scatter, allgather, and allreduce as one followed by the other.

Each rank talks only to its two neighbours, so every link carries the same bytes and the
time is 2 (n-1)/n of the data over one link, whatever the number of ranks. Segments
may differ in length (ragged allgather, uneven splits) and may be empty.
"""

import numpy as np

from ringreduce import ops
from ringreduce.algorithms import pairwise, tree
from ringreduce.machine.layout import even_counts, offsets_of, pieces
from ringreduce.machine.memory import Workspace


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


def allreduce(transport, buf, combine, scratch, chunk_elems, scale_result=None):
    """`scale_result`, if given, runs on this rank's fully reduced segment before it is passed on."""
    offsets = offsets_of(even_counts(len(buf), transport.size))
    reduce_scatter(transport, buf, offsets, combine, scratch, chunk_elems)
    if scale_result is not None:
        scale_result(_segment(buf, offsets, transport.rank))
    allgather(transport, buf, offsets)


def _segment(buf, offsets, index):
    return buf[offsets[index]:offsets[index + 1]]


class RingFamily:
    """The ring's family: reduce-scatter and allgather on the ring, broadcast down a binomial
    tree, alltoall by pairwise exchange, over a point-to-point transport."""

    reads_concatenation = False
    reduces_any_dtype = True

    def __init__(self, transport, chunk_bytes):
        self.transport = transport
        self.workspace = Workspace()
        self.chunk_bytes = chunk_bytes

    def _chunk(self, buf):
        return max(1, self.chunk_bytes // buf.dtype.itemsize)

    def allreduce(self, buf, op, source=None, scale_result=None):
        if source is not None:
            buf[:] = source
        scratch = self.workspace.get(len(buf) // self.transport.size + 1, buf.dtype)
        allreduce(self.transport, buf, ops.ufunc(op), scratch, self._chunk(buf), scale_result)

    def reducescatter(self, buf, offsets, op, source=None):
        if source is not None:
            buf[:] = source
        scratch = self.workspace.get(int(np.max(np.diff(offsets))), buf.dtype)
        reduce_scatter(self.transport, buf, offsets, ops.ufunc(op), scratch, self._chunk(buf))
        rank = self.transport.rank
        return buf[offsets[rank]:offsets[rank + 1]]

    def allgather(self, buf, offsets):
        allgather(self.transport, buf, offsets)

    def broadcast(self, buf, root, source=None):
        if source is not None:
            buf[:] = source
        tree.broadcast(self.transport, buf, root, self._chunk(buf))

    def alltoallv(self, send, send_offsets, recv, recv_offsets):
        pairwise.alltoallv(self.transport, send, send_offsets, recv, recv_offsets)
