"""The collectives on TensorFlow tensors and variables, in eager mode and inside tf.function.

Eagerly, a tensor reaches the core as `tensor.numpy()`. Inside a tf.function the call becomes a
`tf.numpy_function` node with the static shape set on its output, so graphs keep their shapes;
these nodes are stateful, so TensorFlow runs them in program order, the same on every rank.
A collective without a name inside a graph is named after its input tensor, which is the same
on every rank that traces the same code.
"""

import numpy as np

import ringreduce as core
import tensorflow as tf
from ringreduce.compression import Compression


def allreduce(tensor, op=None, name=None, compression=Compression.none, prescale_factor=1.0, postscale_factor=1.0):
    """Combine the tensor of every rank element-wise (Average by default); every rank gets the result."""
    op = core.Average if op is None else op
    return _bridge(lambda array, name: core.allreduce(
        tensor=array, op=op, name=name, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        compression=compression), tensor, name, "allreduce", same_shape=True)


def grouped_allreduce(tensors, op=None, name=None, compression=Compression.none, prescale_factor=1.0,
                      postscale_factor=1.0):
    """allreduce of a list of tensors, submitted together so that they fuse; one graph node."""
    op = core.Average if op is None else op
    tensors = [_value(t) for t in tensors]
    if not tensors:
        return []
    # Eagerly the core names an unnamed group; a graph's node needs its name when it is traced.
    base = name if name or tf.executing_eagerly() else _graph_name(tensors[0], "grouped_allreduce")

    def run(*arrays):
        return [np.asarray(r) for r in core.grouped_allreduce(
            tensors=list(arrays), op=op, name=base, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, compression=compression)]

    if tf.executing_eagerly():
        return [tf.convert_to_tensor(r) for r in run(*[t.numpy() for t in tensors])]
    results = tf.numpy_function(run, tensors, [t.dtype for t in tensors], stateful=True)
    for result, tensor in zip(results, tensors, strict=True):
        result.set_shape(tensor.shape)
    return list(results)


def allgather(tensor, name=None):
    """Concatenate every rank's tensor along the first dimension (which may differ by rank)."""
    return _bridge(lambda array, name: core.allgather(tensor=array, name=name), tensor, name, "allgather",
                   same_shape=False, rows_unknown=True)


def broadcast(tensor, root_rank, name=None):
    """Every rank gets the root rank's tensor."""
    return _bridge(lambda array, name: core.broadcast(tensor=array, root_rank=root_rank, name=name), tensor, name,
                   "broadcast", same_shape=True)


def alltoall(tensor, splits=None, name=None):
    """Send block j of the first dimension to rank j; without `splits` it is divided equally.
    With `splits` the result is (tensor, rows received from each rank), as Horovod."""
    if splits is None:
        return _bridge(lambda array, name: core.alltoall(tensor=array, name=name), tensor, name, "alltoall",
                       same_shape=False, rows_unknown=True)
    tensor = _value(tensor)
    splits = tf.convert_to_tensor(splits, dtype=tf.int64)
    name = name or (None if tf.executing_eagerly() else _graph_name(tensor, "alltoall"))

    def run(array, counts):
        result, received = core.alltoall(tensor=array, splits=counts.tolist(), name=name)
        return np.asarray(result), np.asarray(received, dtype=np.int64)

    if tf.executing_eagerly():
        result, received = run(tensor.numpy(), splits.numpy())
        return tf.convert_to_tensor(result), tf.convert_to_tensor(received)
    result, received = tf.numpy_function(run, [tensor, splits], [tensor.dtype, tf.int64], stateful=True)
    result.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
    received.set_shape([core.size()])
    return result, received


def reducescatter(tensor, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Combine, then each rank keeps its share of the first dimension (the first ranks one more row)."""
    op = core.Average if op is None else op
    return _bridge(lambda array, name: core.reducescatter(
        tensor=array, op=op, name=name, prescale_factor=prescale_factor, postscale_factor=postscale_factor),
                   tensor, name, "reducescatter", same_shape=False, rows_unknown=True)


def _bridge(collective, tensor, name, kind, same_shape, rows_unknown=False):
    """Run `collective(array, name)` on the tensor's values, eagerly or as a graph node."""
    tensor = _value(tensor)
    if tf.executing_eagerly():
        return tf.convert_to_tensor(collective(tensor.numpy(), name))
    name = name or _graph_name(tensor, kind)
    result = tf.numpy_function(lambda array: np.asarray(collective(array, name)), [tensor], tensor.dtype,
                               stateful=True)
    if same_shape:
        result.set_shape(tensor.shape)
    elif rows_unknown and tensor.shape.rank is not None:
        result.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
    return result


def _value(tensor):
    """A tf.Tensor for a tensor, a variable or anything convertible."""
    if isinstance(tensor, tf.Variable):
        return tensor.read_value() if not tf.executing_eagerly() else tf.convert_to_tensor(tensor)
    return tf.convert_to_tensor(tensor)


def _graph_name(tensor, kind):
    """A name that every rank tracing the same code gives this collective."""
    return f"{kind}.{tensor.name}"
