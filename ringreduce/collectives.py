"""The collectives on arrays: check the arguments with every rank, then run the algorithm.

Out-of-place calls return a new array and accept any input (non-contiguous and read-only
arrays are copied once, which the result needs anyway); the in-place forms write into the
array they are given.
"""

import math

import numpy as np

from ringreduce import arrays, ops, runtime
from ringreduce.agreement import SHAPE, Signature
from ringreduce.algorithms.ring import even_counts, offsets_of
from ringreduce.ops import Average


def allreduce(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Combine the arrays of all ranks element-wise; every rank gets the result."""
    array = arrays.as_array(tensor)
    with runtime.active().collective("allreduce", name) as call:
        call.agree(lambda: _reduction_signature(array, op, prescale_factor, postscale_factor))
        result = arrays.fresh_copy(array)
        _allreduce_in_place(call.runtime, result, ops.as_op(op), prescale_factor, postscale_factor)
    return result


def allreduce_(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """allreduce that writes the result into `tensor` (writeable and C-contiguous) and returns it."""
    with runtime.active().collective("allreduce", name) as call:
        call.agree(lambda: _reduction_signature(
            arrays.writable_in_place(tensor, "allreduce_"), op, prescale_factor, postscale_factor))
        _allreduce_in_place(call.runtime, tensor, ops.as_op(op), prescale_factor, postscale_factor)
    return tensor


def reducescatter(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Combine the arrays of all ranks and give each rank its share of the first dimension.

    The rows are split as evenly as possible, the first ranks taking one more when they do
    not divide (as Horovod does).
    """
    array = arrays.as_array(tensor)
    with runtime.active().collective("reducescatter", name) as call:
        call.agree(lambda: _reduction_signature(
            _with_rows(array, "reducescatter"), op, prescale_factor, postscale_factor))
        rt, op = call.runtime, ops.as_op(op)
        rows = even_counts(array.shape[0], rt.topology.size)
        row_size = _row_size(array)
        work = arrays.fresh_copy(array).reshape(-1)
        ops.scale(work, prescale_factor)
        mine = rt.algorithms.reducescatter(work, offsets_of([r * row_size for r in rows]), op)
        ops.finish(mine, op, rt.topology.size, postscale_factor)
    return mine.reshape((rows[rt.topology.rank],) + array.shape[1:])


def allgather(tensor, name=None):
    """Concatenate the arrays of all ranks along the first dimension, which may differ by rank."""
    array = arrays.as_array(tensor)
    with runtime.active().collective("allgather", name) as call:
        rows = call.agree(lambda: _gather_signature(_with_rows(array, "allgather")))
        rt = call.runtime
        row_offsets = offsets_of(rows[:, SHAPE])
        result = np.empty((row_offsets[-1],) + array.shape[1:], dtype=array.dtype)
        mine = rt.topology.rank
        result[row_offsets[mine]:row_offsets[mine + 1]] = array
        rt.algorithms.allgather(result.reshape(-1), [o * _row_size(array) for o in row_offsets])
    return result


def broadcast(tensor, root_rank, name=None):
    """Every rank gets a copy of the root rank's array."""
    array = arrays.as_array(tensor)
    with runtime.active().collective("broadcast", name) as call:
        call.agree(lambda: _broadcast_signature(array, root_rank, call.runtime))
        if call.runtime.topology.rank == root_rank:
            result = arrays.fresh_copy(array)
        else:
            result = np.empty(array.shape, dtype=array.dtype)
        call.runtime.algorithms.broadcast(result.reshape(-1), root_rank)
    return result


def broadcast_(tensor, root_rank, name=None):
    """broadcast into `tensor` (writeable and C-contiguous) on every rank, and return it."""
    with runtime.active().collective("broadcast", name) as call:
        call.agree(lambda: _broadcast_signature(
            arrays.writable_in_place(tensor, "broadcast_"), root_rank, call.runtime))
        call.runtime.algorithms.broadcast(tensor.reshape(-1), root_rank)
    return tensor


def alltoall(tensor, splits=None, name=None):
    """Send block j of the first dimension to rank j; receive and concatenate one block per rank.

    Without `splits` the first dimension is divided equally. With `splits` (rows per
    destination rank) it returns the result and the rows received from each rank, as Horovod.
    """
    array = arrays.as_array(tensor)
    with runtime.active().collective("alltoall", name) as call:
        rt = call.runtime
        size = rt.topology.size
        call.agree(lambda: _alltoall_signature(array, splits, size))
        send_rows = np.array(_checked_splits(array, splits, size), dtype=np.int64)
        received_rows = np.empty(size, dtype=np.int64)
        unit = list(range(size + 1))
        rt.algorithms.alltoallv(send_rows, unit, received_rows, unit)
        row_size = _row_size(array)
        send = arrays.fresh_copy(array).reshape(-1)
        result = np.empty((int(received_rows.sum()),) + array.shape[1:], dtype=array.dtype)
        rt.algorithms.alltoallv(
            send, offsets_of(send_rows * row_size),
            result.reshape(-1), offsets_of(received_rows * row_size),
        )
    return result if splits is None else (result, received_rows)


def barrier():
    """Return only when every rank has called barrier."""
    with runtime.active().collective("barrier", None) as call:
        call.agree(lambda: None)


def _allreduce_in_place(rt, array, op, prescale_factor, postscale_factor):
    flat = array.reshape(-1)
    ops.scale(flat, prescale_factor)
    rt.algorithms.allreduce(flat, op)
    ops.finish(flat, op, rt.topology.size, postscale_factor)


def _reduction_signature(array, op, prescale_factor, postscale_factor):
    arrays.check_dtype(array)
    op = ops.as_op(op)
    ops.check_op(op, array.dtype, prescale_factor, postscale_factor)
    return Signature.of(array, op=op)


def _gather_signature(array):
    arrays.check_dtype(array)
    return Signature.of(array)


def _alltoall_signature(array, splits, size):
    _checked_splits(array, splits, size)
    return _gather_signature(array)


def _broadcast_signature(array, root_rank, rt):
    arrays.check_dtype(array)
    size = rt.topology.size
    if not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < size:
        raise ValueError(f"root_rank {root_rank!r} is not a rank of this job (0 to {size - 1})")
    return Signature.of(array, root=root_rank)


def _with_rows(array, what):
    if array.ndim == 0:
        raise ValueError(f"{what} needs an array with at least one dimension, got a scalar")
    return array


def _checked_splits(array, splits, size):
    """The rows `alltoall` sends to each rank, from `splits` or an equal division."""
    rows = _with_rows(array, "alltoall").shape[0]
    if splits is None:
        if rows % size:
            raise ValueError(
                f"alltoall without splits needs a first dimension ({rows}) divisible by the "
                f"number of ranks ({size}); pass splits to divide it unevenly"
            )
        return [rows // size] * size
    counts = np.asarray(splits).reshape(-1)
    if not np.issubdtype(counts.dtype, np.integer) or len(counts) != size:
        raise ValueError(f"alltoall splits must be {size} whole numbers, one per rank, got {splits!r}")
    if (counts < 0).any() or counts.sum() != rows:
        raise ValueError(
            f"alltoall splits {counts.tolist()} must be non-negative and add up to the first "
            f"dimension ({rows})"
        )
    return counts.tolist()


def _row_size(array):
    return math.prod(array.shape[1:])
