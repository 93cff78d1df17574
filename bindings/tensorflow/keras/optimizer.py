"""A Keras optimizer whose gradients are averaged over every rank before they are applied."""

import sys
import typing

import keras
import numpy as np

import ringreduce as core
import tensorflow as tf
from ringreduce.numerics.compression import CompressorLike
from ringreduce.ops import ReduceOp
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.tensorflow.compression import Compression
from ringreduce.tensorflow.tape import (
    StaleAverages,
    allreduce_gradients,
    divided,
    is_variable,
    local_layer_weights,
    powersgd_average,
)
from ringreduce.training import options
from ringreduce.training.load_balancing import LoadBalancer
from ringreduce.training.powersgd import PowerSGD


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "", compression: CompressorLike = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: ReduceOp = core.Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0, groups: typing.Any = None,
                         process_set: ProcessSet = global_process_set, scale_local_gradients: bool = True,
                         staleness: int = 0, weight_prediction: bool = True,
                         load_balancer: LoadBalancer | None = None) -> keras.optimizers.Optimizer:
    """Wrap a Keras optimizer: it averages the gradients over the ranks of `process_set`, then applies them as before.

        optimizer = rr.DistributedOptimizer(keras.optimizers.Adam(0.001 * rr.size()))
        model.compile(optimizer=optimizer, loss=...)

    The result is a new optimizer of a subclass of the original's class, made from its config.
    With `backward_passes_per_step=k` the gradients of k batches are applied once every k batches
    (through Keras's own gradient accumulation): their sum, as Horovod's, or their mean with
    `average_aggregated_gradients`. Each batch's gradients are averaged over ranks as they come:
    the same update as Horovod's, with k times its communication.

    `compression=rr.PowerSGD(...)` (ringreduce's) averages each batch's gradients as low-rank
    products (ringreduce.training.powersgd), all of them in one step, after backward. `staleness=1` (also
    ringreduce's) applies each batch the average of the previous batch's gradients, averaged while
    this one computed; the first batch applies zeros (docs/communication.md). With
    `weight_prediction` (the default) each batch leaves the weights one more update ahead, where they
    will be when that batch's gradient is applied, and takes that back before the next update.

    `load_balancer` (ringreduce's: a `LoadBalancer`, whose `BalancedDataset` gives the batches)
    weights each rank's gradients by its share of the step's batch, so that the average is the
    batch's mean however it was split, and tells it how long this rank computed.

    Variables registered with `register_local_var(variable)` keep their own rank's gradient,
    divided by the size with `scale_local_gradients`, as Horovod's. `_compute_gradients(loss,
    var_list, tape=None)` gives Horovod's (gradient, variable) pairs, already averaged:
    `apply_gradients` does not average them again.
    """
    options.check(op, compression, gradient_predivide_factor, backward_passes_per_step, staleness, load_balancer,
                  process_set)
    options.groups(num_groups, groups, is_variable, "tf.Variable")
    powersgd = compression if isinstance(compression, PowerSGD) else None
    stale = StaleAverages(op, compression, process_set) if staleness else None
    predicts = bool(staleness and weight_prediction)
    loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    if loss_scaled and (staleness or powersgd is not None or load_balancer is not None or backward_passes_per_step > 1):
        raise ValueError("a LossScaleOptimizer takes plain averaging here: no staleness, PowerSGD, load_balancer or "
                         "backward_passes_per_step")
    base = type(optimizer)
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        config["gradient_accumulation_steps"] = backward_passes_per_step
    # Keras applies the mean of the accumulated gradients; Horovod's default applies their sum.
    summed = backward_passes_per_step if backward_passes_per_step > 1 and not average_aggregated_gradients else 1
    label = name or f"DistributedOptimizer.{base.__name__}"

    def register_local_var(self, variable):
        """Keep `variable`'s gradient to this rank (scaled by 1 / size with scale_local_gradients)."""
        self._local_variables.add(id(variable))  # Keras 3's variables have no ref(); the model keeps them

    def combined(self, grads, variables):
        """The gradients combined over ranks, those of local variables kept to this rank."""
        labels = [getattr(v, "path", None) or v.name for v in variables]
        shared = [i for i, v in enumerate(variables) if id(v) not in self._local_variables]
        result = list(grads)
        if stale is not None:
            return stale(result)
        if powersgd is not None:
            return powersgd_average(powersgd, result, labels, process_set)
        reduced = allreduce_gradients([grads[i] for i in shared], [variables[i] for i in shared],
                                      [labels[i] for i in shared], op, compression, label, sparse_as_dense,
                                      gradient_predivide_factor, process_set)
        for index, value in zip(shared, reduced, strict=True):
            result[index] = value
        for index in set(range(len(variables))) - set(shared):
            if result[index] is not None and scale_local_gradients:
                result[index] = divided(result[index], process_set.size())
        return result

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's: the (gradient, variable) pairs of `loss` (a tensor recorded on `tape`, or a
        callable), combined over ranks."""
        tape = tf.GradientTape() if tape is None else tape
        if callable(loss):
            with tape:
                tape.watch(var_list)
                loss = loss()
        grads = tape.gradient(loss, var_list, grad_loss)
        self._combined_already = True
        return list(zip(self.combined(list(grads), list(var_list)), var_list, strict=True))

    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, tape=tape)

    def apply_gradients(self, grads_and_vars, *args, experimental_aggregate_gradients=True, **kwargs):
        """Keras's, accepting Horovod's (Keras 2's) `experimental_aggregate_gradients`."""
        return super(distributed, self).apply_gradients(grads_and_vars, *args, **kwargs)

    def apply(self, grads, trainable_variables=None):
        """A LossScaleOptimizer's: the scaled gradients averaged first, so that every rank sees the
        same ones, finds them finite or not alike, and updates (or lowers its scale) alike."""
        variables = list(trainable_variables if trainable_variables is not None else self._trainable_variables)
        return super(distributed, self).apply(self.combined(list(grads), variables), trainable_variables)

    def build(self, variables):
        caller = sys._getframe(1).f_locals.get("self")  # a LossScaleOptimizer that builds this, its inner one
        if caller is not self and isinstance(caller, keras.optimizers.LossScaleOptimizer):
            raise ValueError("LossScaleOptimizer(DistributedOptimizer(...)) checks each rank's own gradients, so the "
                             "ranks would skip different steps: wrap the other way round, "
                             "DistributedOptimizer(LossScaleOptimizer(optimizer))")
        super(distributed, self).build(variables)
        if predicts:  # per variable: the last update, which the weights are moved on by once more
            self._last_updates = [self.add_variable_from_reference(v, name="last_update") for v in variables]

    def _backend_apply_gradients(self, grads, trainable_variables):
        """Keras calls this with each batch's gradients before it accumulates or applies them:
        average them over ranks first."""
        apply = super(distributed, self)._backend_apply_gradients
        if load_balancer is not None:
            grads = _weighted(load_balancer, grads)
        if predicts:
            _apply_predicting(self, apply, stale(list(grads)), trainable_variables)
        else:
            if not self._combined_already:
                grads = self.combined(list(grads), list(trainable_variables))
            self._combined_already = False
            apply([g * summed if g is not None and summed != 1 else g for g in grads], trainable_variables)
        if load_balancer is not None:  # after the update (TensorFlow runs stateful calls in program order)
            tf.numpy_function(lambda: load_balancer.step_done() or np.int8(0), [], tf.int8, stateful=True)

    methods = dict(register_local_var=register_local_var, combined=combined, _compute_gradients=_compute_gradients,
                   compute_gradients=compute_gradients, apply_gradients=apply_gradients, build=build,
                   _backend_apply_gradients=_backend_apply_gradients, __module__=base.__module__)
    if loss_scaled:  # its apply() unscales, checks and hands the result to its inner optimizer
        methods["apply"] = apply
    distributed: typing.Any = type(base.__name__, (base,), methods)
    wrapped = distributed.from_config(config)
    wrapped._local_variables = set()
    wrapped._combined_already = False  # set by _compute_gradients for the apply_gradients after it
    wrapped._agg_helper = _Aggregation(wrapped, backward_passes_per_step) if backward_passes_per_step > 1 else None
    return wrapped


def PartialDistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None, device_dense: str = "",
                                device_sparse: str = "", compression: CompressorLike = Compression.none,
                                sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                                op: ReduceOp = core.Average, groups: typing.Any = None,
                                process_set: ProcessSet = global_process_set, local_layers: typing.Any = None,
                                scale_local_gradients: bool = True) -> keras.optimizers.Optimizer:
    """DistributedOptimizer whose `local_layers` (a Keras layer or several) keep their gradients
    to each rank, as Horovod's."""
    if op not in (core.Average, core.Sum):
        raise ValueError("PartialDistributedOptimizer takes op=Average or op=Sum")
    wrapped = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                   gradient_predivide_factor, op, groups=groups, process_set=process_set,
                                   scale_local_gradients=scale_local_gradients)
    for variable in local_layer_weights(local_layers):
        wrapped.register_local_var(variable)
    return wrapped


class _Aggregation:
    """Horovod's `_agg_helper` of an optimizer that aggregates k backward passes: `counter` is the
    passes aggregated since the last update."""

    def __init__(self, optimizer, passes):
        self._optimizer, self._passes = optimizer, passes

    @property
    def counter(self):
        return self._optimizer.iterations % self._passes



def _apply_predicting(optimizer, apply, grads, variables):
    """Weight prediction around the update: the weights back from the last prediction (w - d), the
    update, then d = the update and the weights moved on by it once more (w + d)."""
    updates = [optimizer._last_updates[optimizer._get_variable_index(v)] for v in variables]
    for variable, update in zip(variables, updates, strict=True):
        variable.assign_sub(update)
    before = [tf.identity(v) for v in variables]
    apply(grads, variables)
    for variable, update, old in zip(variables, updates, before, strict=True):
        update.assign(variable - old)
        variable.assign_add(update)


def _weighted(balancer, grads):
    """The gradients times this rank's weight in the step's batch (asked when they are ready, which
    ends the timing of this rank's work)."""
    def weight(_):
        balancer.work_done()
        return np.float32(balancer.weight())
    # An input from the gradients, so that it runs once they are ready (after this batch was read).
    ready = tf.add_n([tf.cast(tf.reshape(getattr(g, "values", g), [-1])[0], tf.float32)
                      for g in grads if g is not None])
    factor = tf.numpy_function(weight, [ready], tf.float32, stateful=True)
    return [None if g is None else g * tf.cast(factor, g.dtype) for g in grads]
