"""DistributedGradientTape: a tf.GradientTape whose gradients are averaged over every rank."""

import numpy as np

import ringreduce as core
import tensorflow as tf
from ringreduce.compression import Compression
from ringreduce.errors import ranks_text


def allreduce_gradients(gradients, labels, op=core.Average, compression=Compression.none, name="gradients"):
    """Gradients combined over ranks, submitted together so that they fuse, as one graph node
    inside a tf.function. None stays None (a variable no rank's loss touched); a gradient that
    is None on some ranks only is an error on every rank that names the variable and the ranks.
    tf.IndexedSlices (from embedding lookups) are made dense first, so every rank contributes
    a tensor of the variable's full shape. `labels` name the gradients in errors."""
    dense = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients]
    present = [i for i, g in enumerate(dense) if g is not None]
    mask = np.array([[g is not None for g in dense]], dtype=np.uint8)

    def reduce(*arrays):
        _check_presence(core.allgather(tensor=mask, name=f"{name}.present"), labels, name)
        return [np.asarray(r) for r in core.grouped_allreduce(tensors=list(arrays), op=op, name=name,
                                                             compression=compression)]

    inputs = [dense[i] for i in present]
    if tf.executing_eagerly():
        reduced = [tf.convert_to_tensor(r) for r in reduce(*[t.numpy() for t in inputs])]
    else:
        reduced = tf.numpy_function(reduce, inputs, [t.dtype for t in inputs], stateful=True) if inputs else []
        for result, tensor in zip(reduced, inputs, strict=True):
            result.set_shape(tensor.shape)
    result = list(dense)
    for index, value in zip(present, reduced, strict=True):
        result[index] = value
    return result


def _check_presence(presence, labels, name):
    """presence[rank, i]: whether rank has gradient i. Raise where ranks disagree."""
    counts = presence.sum(axis=0)
    for index in np.flatnonzero((counts > 0) & (counts < len(presence))):
        missing = np.flatnonzero(presence[:, index] == 0).tolist()
        having = np.flatnonzero(presence[:, index]).tolist()
        raise ValueError(
            f"{name}: the gradient of {labels[index]} is None on {ranks_text(missing)} but not on "
            f"{ranks_text(having)}; every rank's loss must depend on the same variables")


class DistributedGradientTape:
    """Wraps a tf.GradientTape: `gradient()` returns the gradients averaged over ranks (by `op`).

        with tf.GradientTape() as tape:
            loss = ...
        tape = rr.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, model.trainable_variables)

    Every rank must ask for the gradients of the same sources in the same order.
    """

    def __init__(self, tape, compression=Compression.none, op=core.Average, name="DistributedGradientTape"):
        self._tape = tape
        self.compression = compression
        self.op = op
        self.name = name

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        gradients = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        labels = [getattr(s, "path", None) or getattr(s, "name", None) or f"source {i}"
                  for i, s in enumerate(tf.nest.flatten(sources))]
        reduced = allreduce_gradients(tf.nest.flatten(gradients), labels, self.op, self.compression, self.name)
        return tf.nest.pack_sequence_as(gradients, reduced)

    def __getattr__(self, attribute):  # watch(), stop_recording(), reset(), ...
        return getattr(self._tape, attribute)
