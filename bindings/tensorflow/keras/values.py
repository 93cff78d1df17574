"""horovod.tensorflow.keras's collectives on values: anything tf.constant takes in, numpy values
out (Horovod evaluates them with the Keras backend). A tf.Tensor (also inside a tf.function)
gives a tensor, as ringreduce.tensorflow's collectives do."""

import typing

import numpy as np

import ringreduce as core
import tensorflow as tf
from ringreduce.numerics.compression import CompressorLike
from ringreduce.ops import ReduceOp
from ringreduce.tensorflow import tensors
from ringreduce.tensorflow.compression import Compression


def allreduce(value: typing.Any, name: str | None = None, average: bool | None = True, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: ReduceOp | None = None,
              compression: CompressorLike = Compression.none) -> np.ndarray | tf.Tensor:
    """The average (or, with `average=False` or `op`, the op) of `value` over every rank."""
    op = op if op is not None else core.Average if average else core.Sum
    return _on_value(lambda t: tensors.allreduce(t, compression=compression, op=op, prescale_factor=prescale_factor,
                                                 postscale_factor=postscale_factor, name=name), value)


def allgather(value: typing.Any, name: str | None = None) -> np.ndarray | tf.Tensor:
    return _on_value(lambda t: tensors.allgather(t, name=name), value)


def broadcast(value: typing.Any, root_rank: int, name: str | None = None) -> np.ndarray | tf.Tensor:
    return _on_value(lambda t: tensors.broadcast(t, root_rank, name=name), value)


def reducescatter(value: typing.Any, name: str | None = None, op: ReduceOp = core.Average) -> np.ndarray | tf.Tensor:
    return _on_value(lambda t: tensors.reducescatter(t, op=op, name=name), value)


def _on_value(collective, value):
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return collective(value)
    return collective(tf.constant(value)).numpy()
