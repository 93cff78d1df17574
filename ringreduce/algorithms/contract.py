"""What an algorithm family offers, written down: the host families (ring, shared memory and
hierarchical, MPI's own) work on numpy arrays, the device families (NCCL, CUDA-aware MPI,
staging through the host) on CuPy arrays. The execution layer calls nothing else.

Every call works on flat contiguous arrays of one dtype and element offsets, in place; the
layer above handles shapes, dtypes, scaling and copies. Every rank of the family's communicator
makes the same calls in the same order.

An allreduce's `scale_result` (Average's division, the postscale) runs in place on each
stretch of the result once it is reduced and before it is passed on: by one rank, on its share,
while that share is still in the cache, instead of by every rank in one more pass over the whole
result.
"""

import typing


@typing.runtime_checkable
class HostFamily(typing.Protocol):
    # Does allreduce take its `source` and `buf` as layout.Concatenations (a fused group's arrays
    # read and written where they lie) rather than as arrays? A family declares it.
    reads_concatenation: bool
    # Can it reduce any dtype numpy can add (ml_dtypes' bfloat16 too), not only MPI's datatypes?
    reduces_any_dtype: bool
    # Does it combine every element's values in rank order, ((x0 + x1) + x2) + ..., wherever the
    # element lies? RINGREDUCE_DETERMINISTIC keeps such a family and replaces the others.
    adds_in_rank_order: bool

    def allreduce(self, buf, op, source=None, scale_result=None):
        """Reduce every rank's `buf` in place, or every rank's `source` (this rank's contribution,
        same length and dtype) into `buf`; then `scale_result` on the result, if given."""

    def reducescatter(self, buf, offsets, op, source=None):
        """Reduce every rank's `buf` (or `source`); return this rank's segment of the result,
        [offsets[rank], offsets[rank + 1]), which may be a view of `buf`."""

    def allgather(self, buf, offsets):
        """Fill every segment of `buf` from the rank that owns it (segment r belongs to rank r)."""

    def broadcast(self, buf, root, source=None):
        """`buf` on every rank gets the root's values: its `buf`, or its `source` if it passes one."""

    def alltoallv(self, send, send_offsets, recv, recv_offsets):
        """Block j of `send` goes to rank j; block j of `recv` comes from rank j. (The shared-memory
        family has none: choice.plan never gives it alltoall.)"""


@typing.runtime_checkable
class DeviceFamily(typing.Protocol):
    """The same collectives on flat CuPy buffers, queued on the family's own CUDA `stream`; the
    device executor queues its packing and casting kernels there too, and waits for the stream
    once before it hands out results. Average's division and the postscale are the executor's
    (one kernel with the cast back)."""

    stream: typing.Any

    def allreduce(self, buf, op, source=None): ...

    def reducescatter(self, buf, offsets, op, source=None): ...

    def allgather(self, buf, offsets): ...

    def broadcast(self, buf, root): ...

    def synchronize(self):
        """Return once the work queued on `stream` is done (or raise what keeps it from ending)."""
