"""Keras callbacks with the meaning they have in Horovod."""

import keras
import numpy as np

import ringreduce as core
from ringreduce.tensorflow.variables import broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, give every rank the root rank's model weights and optimizer
    state, so that ranks initialised differently train the same model. A model that is not built
    yet at that point is broadcast after its first batch instead."""

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank = root_rank
        self.done = False

    def on_train_begin(self, logs=None):
        if self.model.built:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.done:
            self._broadcast()

    def _broadcast(self):
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        broadcast_variables(self.model.variables, self.root_rank, name="keras.model")
        if optimizer is not None:
            broadcast_variables(optimizer.variables, self.root_rank, name="keras.optimizer")
        self.done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replace each logged metric by its average over ranks (each rank
    measured it on its own shard). Put it before callbacks that read the metrics."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
        values = np.array([float(logs[k]) for k in names], dtype=np.float64)
        averaged = core.allreduce(tensor=values, op=core.Average, name=f"keras.metrics.{epoch}.{','.join(names)}")
        for name, value in zip(names, averaged.tolist(), strict=True):
            logs[name] = value


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Ramp the learning rate up from initial_lr / size to initial_lr over the first
    `warmup_epochs` epochs, batch by batch (Goyal et al., as Horovod's callback): large
    effective batches train badly with the full rate from the first step. `initial_lr` is the
    rate after warm-up, usually the single-process rate times size()."""

    def __init__(self, initial_lr, warmup_epochs=5, steps_per_epoch=None, verbose=0):
        super().__init__()
        self.initial_lr = initial_lr
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.epoch = 0

    def multiplier(self, epoch):
        """The share of initial_lr at a (fractional) epoch."""
        size = core.size()
        return 1.0 / size * (min(epoch, self.warmup_epochs) * (size - 1) / self.warmup_epochs + 1)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch >= self.warmup_epochs:
            return
        steps = self.steps_per_epoch or self.params.get("steps") or 1
        self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(self.epoch + batch / steps)

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            self.model.optimizer.learning_rate = self.initial_lr
            if self.verbose and core.rank() == 0:
                print(f"Epoch {epoch + 1}: finished the learning rate warm-up at {self.initial_lr:g}")
        if logs is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
