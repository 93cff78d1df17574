"""Point-to-point transfers of tensors, eagerly, with torch.distributed's names and argument order
(Horovod has none): `send` takes any tensor, `recv` receives into a tf.Variable of the same dtype
and shape (TensorFlow's tensors cannot be written) and returns the sender's rank."""

import numpy as np

import tensorflow as tf
from ringreduce import point_to_point as core
from ringreduce.point_to_point import Work
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.tensorflow.tensors import TensorLike, raised_as_tensorflow_errors


def send(tensor: TensorLike, dst: int, process_set: ProcessSet = global_process_set, tag: int = 0) -> None:
    with raised_as_tensorflow_errors():
        core.send(_eager_value(tensor, "send"), dst, process_set, tag)


def recv(tensor: tf.Variable, src: int | None = None, process_set: ProcessSet = global_process_set,
         tag: int = 0) -> int:
    return irecv(tensor, src, process_set, tag).wait()


def isend(tensor: TensorLike, dst: int, process_set: ProcessSet = global_process_set, tag: int = 0) -> Work:
    with raised_as_tensorflow_errors():
        return core.isend(_eager_value(tensor, "isend"), dst, process_set, tag)


def irecv(tensor: tf.Variable, src: int | None = None, process_set: ProcessSet = global_process_set,
          tag: int = 0) -> "_Received":
    if not isinstance(tensor, tf.Variable):
        raise TypeError(f"recv receives into a tf.Variable, got {type(tensor).__name__}")
    array = np.empty(tensor.shape, tensor.dtype.as_numpy_dtype)
    with raised_as_tensorflow_errors():
        return _Received(core.irecv(array, src, process_set, tag), tensor, array)


def _eager_value(tensor, what):
    if not tf.executing_eagerly():
        raise RuntimeError(f"{what} runs eagerly only, not inside tf.function or a graph")
    return np.asarray(tf.convert_to_tensor(tensor))


class _Received:
    def __init__(self, work, variable, array):
        self._work, self._variable, self._array = work, variable, array

    def is_completed(self):
        return self._work.is_completed()

    done = is_completed

    def wait(self, timeout=None):
        with raised_as_tensorflow_errors():
            sender = self._work.wait(timeout)
        self._variable.assign(self._array)
        return sender
