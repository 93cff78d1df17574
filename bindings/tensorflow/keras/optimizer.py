"""A Keras optimizer whose gradients are averaged over every rank before they are applied."""

import numpy as np

import ringreduce as core
import tensorflow as tf
from ringreduce.powersgd import PowerSGD
from ringreduce.process_sets import global_process_set
from ringreduce.tensorflow.compression import Compression
from ringreduce.tensorflow.tape import StaleAverages, allreduce_gradients, check_groups, powersgd_average


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=core.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True, staleness=0,
                         weight_prediction=True, load_balancer=None):
    """Wrap a Keras optimizer: it averages the gradients over the ranks of `process_set`, then applies them as before.

        optimizer = rr.DistributedOptimizer(keras.optimizers.Adam(0.001 * rr.size()))
        model.compile(optimizer=optimizer, loss=...)

    The result is a new optimizer of a subclass of the original's class, made from its config.
    With `backward_passes_per_step=k` the gradients of k batches are applied once every k batches
    (through Keras's own gradient accumulation): their sum, as Horovod's, or their mean with
    `average_aggregated_gradients`. Each batch's gradients are averaged over ranks as they come:
    the same update as Horovod's, with k times its communication.

    `compression=rr.PowerSGD(...)` (ringreduce's) averages each batch's gradients as low-rank
    products (ringreduce.powersgd), all of them in one step, after backward. `staleness=1` (also
    ringreduce's) applies each batch the average of the previous batch's gradients, averaged while
    this one computed; the first batch applies zeros (docs/communication.md). With
    `weight_prediction` (the default) each batch leaves the weights one more update ahead, where they
    will be when that batch's gradient is applied, and takes that back before the next update.

    `load_balancer` (ringreduce's: a `LoadBalancer`, whose `BalancedDataset` gives the batches)
    weights each rank's gradients by its share of the step's batch, so that the average is the
    batch's mean however it was split, and tells it how long this rank computed.
    """
    powersgd = compression if isinstance(compression, PowerSGD) else None
    if powersgd is not None and (op != core.Average or gradient_predivide_factor != 1.0):
        raise ValueError("PowerSGD averages: it takes op=Average and no gradient_predivide_factor")
    if staleness not in (0, 1):
        raise ValueError(f"staleness must be 0 (synchronous) or 1 (one step stale), got {staleness!r}")
    if staleness and (powersgd is not None or op != core.Average or compression is not Compression.none):
        raise ValueError("staleness=1 averages uncompressed gradients: it takes op=Average and no compression")
    stale = StaleAverages(process_set) if staleness else None
    predicts = bool(staleness and weight_prediction)
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be at least 1, got {backward_passes_per_step}")
    if load_balancer is not None:
        load_balancer.check_optimizer(process_set, backward_passes_per_step, op)
    check_groups(num_groups, groups)
    base = type(optimizer)
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        config["gradient_accumulation_steps"] = backward_passes_per_step
    # Keras applies the mean of the accumulated gradients; Horovod's default applies their sum.
    summed = backward_passes_per_step if backward_passes_per_step > 1 and not average_aggregated_gradients else 1
    label = name or f"DistributedOptimizer.{base.__name__}"

    def build(self, variables):
        super(distributed, self).build(variables)
        if predicts:  # per variable: the last update, which the weights are moved on by once more
            self._last_updates = [self.add_variable_from_reference(v, name="last_update") for v in variables]

    def _backend_apply_gradients(self, grads, trainable_variables):
        """Keras calls this with each batch's gradients before it accumulates or applies them:
        average them over ranks first."""
        labels = [getattr(v, "path", None) or v.name for v in trainable_variables]
        apply = super(distributed, self)._backend_apply_gradients
        if load_balancer is not None:
            grads = _weighted(load_balancer, grads)
        if predicts:
            _apply_predicting(self, apply, stale(list(grads)), trainable_variables)
        else:
            if stale is not None:
                grads = stale(list(grads))
            elif powersgd is not None:
                grads = powersgd_average(powersgd, list(grads), labels, process_set)
            else:
                grads = allreduce_gradients(list(grads), labels, op, compression, label, sparse_as_dense,
                                            gradient_predivide_factor, process_set)
            apply([g * summed if g is not None and summed != 1 else g for g in grads], trainable_variables)
        if load_balancer is not None:  # after the update (TensorFlow runs stateful calls in program order)
            tf.numpy_function(lambda: load_balancer.step_done() or np.int8(0), [], tf.int8, stateful=True)

    distributed = type(base.__name__, (base,), {"build": build, "_backend_apply_gradients": _backend_apply_gradients,
                                                 "__module__": base.__module__})
    return distributed.from_config(config)


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
