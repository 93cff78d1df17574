"""A Keras optimizer whose gradients are averaged over every rank before they are applied."""

import ringreduce as core
from ringreduce.compression import Compression
from ringreduce.tensorflow.tape import allreduce_gradients


def DistributedOptimizer(optimizer, compression=Compression.none, backward_passes_per_step=1, op=core.Average,
                         name=None):
    """Wrap a Keras optimizer: it averages the gradients over ranks, then applies them as before.

        optimizer = rr.DistributedOptimizer(keras.optimizers.Adam(0.001 * rr.size()))
        model.compile(optimizer=optimizer, loss=...)

    The result is a new optimizer of a subclass of the original's class, made from its config.
    `backward_passes_per_step=k` applies the mean of k batches' gradients once every k batches
    (through Keras's own gradient accumulation); each batch's gradients are averaged over ranks
    as they come, so the update is the same as Horovod's, with k times its communication.
    """
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be at least 1, got {backward_passes_per_step}")
    base = type(optimizer)
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        config["gradient_accumulation_steps"] = backward_passes_per_step
    label = name or f"DistributedOptimizer.{base.__name__}"

    def _backend_apply_gradients(self, grads, trainable_variables):
        """Keras calls this with the gradients it is about to apply (after its accumulation over
        backward passes, if any): average them over ranks first."""
        labels = [getattr(v, "path", None) or v.name for v in trainable_variables]
        grads = allreduce_gradients(list(grads), labels, op, compression, label)
        return super(distributed, self)._backend_apply_gradients(grads, trainable_variables)

    distributed = type(base.__name__, (base,), {"_backend_apply_gradients": _backend_apply_gradients,
                                                 "__module__": base.__module__})
    return distributed.from_config(config)
