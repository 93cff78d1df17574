"""DistributedGradientTape: a tf.GradientTape whose gradients are averaged over every rank, and
the gradient averaging that the Keras and TensorFlow optimizers share."""

import itertools
import typing

import keras
import numpy as np

import ringreduce as core
import tensorflow as tf
from ringreduce.numerics import compression as compressors
from ringreduce.numerics.compression import CompressorLike
from ringreduce.ops import ReduceOp
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.tensorflow import tensors
from ringreduce.tensorflow.compression import Compression, in_engine
from ringreduce.training import options, presence
from ringreduce.training.powersgd import PowerSGD


def allreduce_gradients(gradients, variables, labels, op=core.Average, compression=Compression.none,
                        name="gradients", sparse_as_dense=False, gradient_predivide_factor=1.0,
                        process_set=global_process_set):
    """The gradients of `variables` combined over the ranks of `process_set`, submitted together so
    that they fuse. A gradient that is None here but not on another rank takes part as zeros, one
    that is None everywhere stays None (ringreduce.training.presence); inside a graph, whose inputs
    are fixed when it is built, a gradient None on some ranks only is a ValueError instead that
    names it and the ranks. tf.IndexedSlices (from embedding lookups) are gathered, as Horovod
    does, or made dense first with `sparse_as_dense`. With Average, `gradient_predivide_factor` f
    divides by f before the sum and by size / f after it (the callers' options were checked by
    ringreduce.training.options when they were built). `labels` name the gradients in errors."""
    if sparse_as_dense:
        gradients = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients]
    kinds = [presence.MISSING if g is None else presence.SPARSE if isinstance(g, tf.IndexedSlices)
             else presence.DENSE for g in gradients]
    checked = []
    if tf.executing_eagerly():
        with tensors.raised_as_tensorflow_errors():
            plan = presence.stand_ins(kinds, labels, f"{name}.present", process_set)
        gradients = [_stand_in(kind, v) if g is None else g
                     for g, kind, v in zip(gradients, plan, variables, strict=True)]
    else:
        def check(arrays, check_name):
            presence.check_all_or_none(arrays[0], labels, check_name, process_set)
            return arrays

        checked = tensors.run_on_values("present", f"{name}.present", [tf.constant(kinds, tf.uint8)], check,
                                        [tf.TensorShape([len(kinds)])])
    present = [i for i, g in enumerate(gradients) if g is not None]
    result = list(gradients)
    if present:
        with tf.control_dependencies(checked):
            reduced = tensors.grouped_allreduce([gradients[i] for i in present], compression=compression, op=op,
                                                prescale_factor=1.0 / gradient_predivide_factor,
                                                postscale_factor=gradient_predivide_factor, name=name,
                                                process_set=process_set)
        for index, value in zip(present, reduced, strict=True):
            result[index] = value
    return result


def _stand_in(kind, variable):
    """What this rank contributes for a gradient it lacks: zeros, dense or as no slices at all."""
    if kind == presence.DENSE:
        return tf.zeros(variable.shape, variable.dtype)
    if kind == presence.SPARSE:
        return tf.IndexedSlices(tf.zeros([0, *variable.shape[1:]], variable.dtype), tf.zeros([0], tf.int32),
                                dense_shape=tf.constant(variable.shape, tf.int64))
    return None


def divided(gradient, size):
    """A local source's gradient scaled by 1 / size (Horovod's scale_local_gradients), dense or
    tf.IndexedSlices."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / size, gradient.indices, gradient.dense_shape)
    return gradient / size


def powersgd_average(powersgd, gradients, labels, process_set=global_process_set):
    """Gradients averaged by PowerSGD (ringreduce.training.powersgd) over the ranks of `process_set`, eagerly or
    as one graph node. It works on float32 or float64 copies of their values (others are cast) and
    keeps its state per label."""
    present = [i for i, g in enumerate(gradients) if g is not None]
    values = [tf.convert_to_tensor(gradients[i]) for i in present]

    def average(arrays, _):
        named = {labels[i]: np.array(a, dtype=a.dtype if a.dtype in (np.float32, np.float64) else np.float32)
                 for i, a in zip(present, arrays, strict=True)}
        powersgd.average(named, process_set)
        return [averaged.astype(a.dtype, copy=False) for averaged, a in zip(named.values(), arrays, strict=True)]

    result = list(gradients)
    if values:
        averaged = tensors.run_on_values("powersgd", "powersgd", values, average, tensors.same_shapes(values))
        for index, value in zip(present, averaged, strict=True):
            result[index] = value
    return result


class StaleAverages:
    """staleness=1 for Keras: each call starts combining (copies of) this step's gradients over the
    ranks of `process_set` by `op` in the background and gives the last call's results, zeros at
    the first call; eagerly or as one graph node. Every gradient must be present (not None). The
    built-in compressions cast in the engine; a compressor of one's own compresses this step's
    gradients before they leave and decompresses the last step's as they arrive."""

    _made = itertools.count()  # each its own request name: an earlier one's last averages may be in flight

    def __init__(self, op: ReduceOp = core.Average, compression: CompressorLike = Compression.none,
                 process_set: ProcessSet = global_process_set) -> None:
        self.op, self.process_set = op, process_set
        engine = in_engine(compression)
        self._compression = compression if engine is None else None  # one of the user's own
        self._engine_compression = engine or compressors.Compression.none
        self._pending = None  # the handle of the last call's results
        self._last_contexts = None  # the user's compressor's contexts of the last call's gradients
        self._name = f"stale_gradients.{next(self._made)}"

    def __call__(self, gradients):
        if any(g is None for g in gradients):
            raise ValueError("staleness=1 needs a gradient for every variable; one is None")
        values = [tf.convert_to_tensor(g) for g in gradients]
        if self._compression is None:
            return tensors.run_on_values("stale", "stale", values, self._exchange, tensors.same_shapes(values))
        packed = compressors.compress_all(self._compression, values, [f"{self._name}.{i}" for i in range(len(values))])
        sent, contexts = [t for t, _ in packed], [c for _, c in packed]
        arrived_contexts = self._last_contexts or contexts  # what arrives is the last call's
        self._last_contexts = contexts
        arrived = tensors.run_on_values("stale", "stale", sent, self._exchange, tensors.same_shapes(sent))
        return [self._compression.decompress(a, c) for a, c in zip(arrived, arrived_contexts, strict=True)]

    def _exchange(self, arrays, _):
        last = self._pending.wait() if self._pending is not None else [np.zeros_like(a) for a in arrays]
        self._pending = core.grouped_allreduce_async_([np.array(a) for a in arrays], op=self.op, name=self._name,
                                                      compression=self._engine_compression,
                                                      process_set=self.process_set)
        return last


def is_variable(value):
    return isinstance(value, (tf.Variable, keras.Variable))


class DistributedGradientTape:
    """Wraps a tf.GradientTape: `gradient()` returns the gradients averaged over the ranks of
    `process_set` (by `op`),
    except those of sources registered with `register_local_source`, which stay this rank's
    (divided by the size with `scale_local_gradients`, as Horovod).

        with tf.GradientTape() as tape:
            loss = ...
        tape = rr.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, model.trainable_variables)

    Every rank must ask for the gradients of the same sources in the same order.
    """

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                 compression: CompressorLike = Compression.none, sparse_as_dense: bool = False,
                 op: ReduceOp = core.Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                 groups: typing.Any = None, process_set: ProcessSet = global_process_set,
                 scale_local_gradients: bool = True) -> None:
        options.check(op, compression, gradient_predivide_factor)
        options.groups(num_groups, groups, is_variable, "tf.Variable")
        self._tape = gradtape
        self.compression, self.op, self.sparse_as_dense = compression, op, sparse_as_dense
        self.gradient_predivide_factor = gradient_predivide_factor
        self.scale_local_gradients, self.process_set = scale_local_gradients, process_set
        self._local_sources: set[int] = set()

    def register_local_source(self, source: tf.Variable) -> None:
        """Keep this source's gradient local: not combined over ranks."""
        self._local_sources.add(id(source))

    def gradient(self, target: typing.Any, sources: typing.Any, output_gradients: typing.Any = None,
                 **kwargs) -> typing.Any:
        gradients = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat_sources, flat = tf.nest.flatten(sources), tf.nest.flatten(gradients)
        shared = [i for i, s in enumerate(flat_sources) if id(s) not in self._local_sources]
        labels = [getattr(s, "path", None) or getattr(s, "name", None) or f"source {i}"
                  for i, s in enumerate(flat_sources)]
        if isinstance(self.compression, PowerSGD):
            reduced = powersgd_average(self.compression, [flat[i] for i in shared], [labels[i] for i in shared],
                                       self.process_set)
        else:
            reduced = allreduce_gradients([flat[i] for i in shared], [flat_sources[i] for i in shared],
                                          [labels[i] for i in shared], self.op, self.compression,
                                          "DistributedGradientTape", self.sparse_as_dense,
                                          self.gradient_predivide_factor, self.process_set)
        result = [divided(g, self.process_set.size()) if g is not None and self.scale_local_gradients else g
                  for g in flat]
        for index, value in zip(shared, reduced, strict=True):
            result[index] = value
        return tf.nest.pack_sequence_as(gradients, result)

    def __getattr__(self, attribute):  # watch(), stop_recording(), reset(), ...
        return getattr(self._tape, attribute)


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                                   compression: CompressorLike = Compression.none, sparse_as_dense: bool = False,
                                   op: ReduceOp = core.Average, gradient_predivide_factor: float = 1.0,
                                   num_groups: int = 0, groups: typing.Any = None,
                                   process_set: ProcessSet = global_process_set, local_layers: typing.Any = None,
                                   scale_local_gradients: bool = True) -> DistributedGradientTape:
    """DistributedGradientTape whose `local_layers` (a Keras layer or several) keep their
    gradients to each rank, as Horovod's."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for variable in local_layer_weights(local_layers):
        tape.register_local_source(variable)
    return tape


def local_layer_weights(local_layers):
    """The trainable weights of `local_layers`: None, a Keras layer or several."""
    if local_layers is None:
        return []
    if isinstance(local_layers, tf.keras.layers.Layer):
        local_layers = [local_layers]
    if not all(isinstance(layer, tf.keras.layers.Layer) for layer in local_layers):
        raise ValueError("local_layers must be Keras layers")
    return [v for layer in local_layers for v in layer.trainable_weights]
