"""Reductions whose every element combines the ranks' values in rank order, whatever the tensor's
length, its place in a fused buffer, the piece size or the family the cost model would pick
(RINGREDUCE_DETERMINISTIC): the same bits in every run. Floating-point addition is not
associative, so a ring, a tree or shared memory each add in an order of their own, and the ring's
depends on where an element lies.

A reduce-scatter that sends each rank its block of every rank's values (pairwise, as alltoall)
and adds them in rank order: each rank sends and receives (n-1)/n of the array, as the ring's
reduce-scatter does, in n-1 exchanges. The allreduce gathers the reduced blocks after it.
"""

from ringreduce.algorithms import pairwise, ring
from ringreduce.machine.layout import even_counts, offsets_of
from ringreduce.machine.memory import Workspace
from ringreduce.numerics import reduction


class RankOrderFamily:
    """The host contract's reductions only: the selector hands it nothing else."""

    reads_concatenation = False
    reduces_any_dtype = True
    adds_in_rank_order = True

    def __init__(self, transport):
        self.transport = transport
        self.workspace = Workspace()

    def allreduce(self, buf, op, source=None, scale_result=None):
        offsets = offsets_of(even_counts(len(buf), self.transport.size))
        mine = self.reducescatter(buf, offsets, op, source)
        if scale_result is not None:
            scale_result(mine)
        ring.allgather(self.transport, buf, offsets)

    def reducescatter(self, buf, offsets, op, source=None):
        """Rank r's segment of the result: rank 0's values of it, then rank 1's added, and so on."""
        size, rank = self.transport.size, self.transport.rank
        length = int(offsets[rank + 1] - offsets[rank])
        theirs = self.workspace.get(size * length, buf.dtype)
        pairwise.alltoallv(self.transport, buf if source is None else source, offsets, theirs,
                           [length * r for r in range(size + 1)])
        mine = buf[offsets[rank]:offsets[rank + 1]]
        reduction.combine_in_rank_order(reduction.ufunc(op, buf.dtype), list(theirs.reshape(size, length)), mine)
        return mine
