"""Keras callbacks with the meaning they have in Horovod."""

from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

import ringreduce as core
import tensorflow as tf
from ringreduce.numerics.compression import Compressor
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.tensorflow.compression import Compression, in_engine
from ringreduce.tensorflow.tensors import broadcast_
from ringreduce.training import local_sgd


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, give every rank the root rank's model weights and optimizer
    state, so that ranks initialised differently train the same model. A model that is not built
    yet at that point is broadcast after its first batch instead. `local_variables` (a variable
    or several) keep each rank's own values, as Horovod's."""

    def __init__(self, root_rank: int = 0, device: str = "",
                 local_variables: Sequence[keras.Variable] | None = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.done = False
        if local_variables is None:
            local_variables = []
        elif isinstance(local_variables, (tf.Variable, keras.Variable)):
            local_variables = [local_variables]
        if not all(isinstance(v, (tf.Variable, keras.Variable)) for v in local_variables):
            raise ValueError("local_variables must be variables (tf.Variable or keras.Variable)")
        self._local = {id(v) for v in local_variables}

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.model.built:
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.done:
            self._broadcast()

    def _broadcast(self):
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        broadcast_([v for v in self.model.variables if id(v) not in self._local], self.root_rank, name="keras.model")
        if optimizer is not None:
            broadcast_(optimizer.variables, self.root_rank, name="keras.optimizer")
        self.done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replace each logged metric by its average over ranks (each rank
    measured it on its own shard). Put it before callbacks that read the metrics."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
        values = np.array([float(logs[k]) for k in names], dtype=np.float64)
        averaged = core.allreduce(tensor=values, op=core.Average, name=f"keras.metrics.{epoch}.{','.join(names)}")
        for name, value in zip(names, averaged.tolist(), strict=True):
            logs[name] = value


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to initial_lr * multiplier from `start_epoch` until `end_epoch`
    (exclusive; None: to the end), as Horovod's callback: `multiplier` is a number or a function
    of the epoch, given once per epoch with `staircase`, else batch by batch with fractional
    epochs. `momentum_correction` is Horovod's argument; Keras 3 keeps the momentum inside its
    compiled step, so there is nothing to correct, and it is accepted."""

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float], start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None) -> None:
        super().__init__()
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.staircase, self.steps_per_epoch = staircase, steps_per_epoch
        self.epoch = 0

    def _in_schedule(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch = epoch
        if self.staircase and self._in_schedule(epoch):
            self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.staircase and self._in_schedule(self.epoch):
            steps = self.steps_per_epoch or self.params.get("steps") or 1
            self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(self.epoch + batch / steps)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate up from initial_lr / size to initial_lr over the first
    `warmup_epochs` epochs, batch by batch (Goyal et al., as Horovod's callback): large
    effective batches train badly with the full rate from the first step. `initial_lr` is the
    rate after warm-up, usually the single-process rate times size()."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        super().__init__(initial_lr, self.warmup_multiplier, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def warmup_multiplier(self, epoch: float) -> float:
        """The share of initial_lr at a (fractional) epoch."""
        size = core.size()
        return 1.0 / size * (min(epoch, self.warmup_epochs) * (size - 1) / self.warmup_epochs + 1)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if epoch == self.warmup_epochs - 1:
            self.model.optimizer.learning_rate = self.initial_lr
            if self.verbose and core.rank() == 0:
                print(f"Epoch {epoch + 1}: finished the learning rate warm-up at {self.initial_lr:g}")
        super().on_epoch_end(epoch, logs)


class LocalSGDCallback(keras.callbacks.Callback):
    """Local SGD for Keras (ringreduce's; torch.distributed's schedule, as ringreduce.torch's
    PeriodicModelAverager): compile the model with the plain optimizer, not DistributedOptimizer,
    so that every rank steps on its own, and this averages the model's weights over the ranks of
    `process_set` after every batch of the warm-up and then after every `period`-th batch. With
    `average_optimizer_state` the optimizer's floating state (momentum, Adam's moments) is averaged
    with them; averaging weights and SGD's momentum after every batch is the same as averaging the
    gradients. Start from the same weights (BroadcastGlobalVariablesCallback before this one).

    `outer_optimizer` (a Keras optimizer, e.g. SGD(0.7, momentum=0.9, nesterov=True): DiLoCo) makes
    each average after the warm-up a step of its own on the trainable weights, as ringreduce.torch's
    PeriodicModelAverager does: a copy of them as of the last average moves along the ranks' mean
    change since then; the first average only sets the copy.

    `compression` (`Compression.fp16` or `bf16`) sends each average's change of the model's weights
    since the last average in that dtype, as ringreduce.torch's PeriodicModelAverager does: the
    first average goes in full, the optimizer state always does."""

    def __init__(self, period: int, warmup_steps: int = 0, average_optimizer_state: bool = True,
                 process_set: ProcessSet = global_process_set,
                 outer_optimizer: keras.optimizers.Optimizer | None = None,
                 compression: type[Compressor] = Compression.none) -> None:
        super().__init__()
        local_sgd.check(period, warmup_steps)
        self.period, self.warmup_steps, self.process_set = period, warmup_steps, process_set
        self.average_optimizer_state = average_optimizer_state
        self.outer_optimizer = outer_optimizer
        self.step = 0
        self._average = local_sgd.ModelAverage("keras.local_sgd", in_engine(compression),
                                               _OuterStep(outer_optimizer) if outer_optimizer is not None else None)

    def _set_for(self, step):
        """The set to average over after this step, or None."""
        if step < self.warmup_steps or local_sgd.averages_after(step, self.period, self.warmup_steps):
            return self.process_set
        return None

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step, self.step = self.step, self.step + 1
        process_set = self._set_for(step)
        if process_set is None:
            return
        # The trainable weights take the outer step and travel as changes; the rest goes in full:
        # the model's other variables (batch normalization's statistics), the optimizer's state.
        weights = list(self.model.trainable_variables)
        rest = list(self.model.non_trainable_variables)
        optimizer = self.model.optimizer
        if self.average_optimizer_state and optimizer is not None:
            rest += [v for v in optimizer.variables if v.dtype in ("float16", "bfloat16", "float32", "float64")]
        values = [np.array(v.numpy()) for v in weights + rest]
        self._average(values[:len(weights)], process_set, outer=step >= self.warmup_steps,
                      in_full=values[len(weights):])
        for variable, value in zip(weights + rest, values, strict=True):
            variable.assign(value)


class _OuterStep:
    """DiLoCo's outer step for ModelAverage: the Keras optimizer steps variables holding the
    anchors along the given changes."""

    def __init__(self, optimizer) -> None:
        self._optimizer, self._variables = optimizer, None

    def __call__(self, anchors, changes):
        if self._variables is None:
            self._variables = [keras.Variable(a, name=f"anchor_{i}") for i, a in enumerate(anchors)]
        self._optimizer.apply_gradients(zip(changes, self._variables, strict=True))
        for anchor, variable in zip(anchors, self._variables, strict=True):
            anchor[...] = variable.numpy()


class HierarchicalLocalSGDCallback(LocalSGDCallback):
    """Hierarchical local SGD for Keras, as ringreduce.torch's HierarchicalModelAverager:
    `period_group_size_dict` ({period: group size}, e.g. {1: 2, 4: 4}: after every batch among
    pairs of consecutive ranks, after every fourth among all four); after each batch the largest
    period that divides its count chooses the group; the warm-up averages over the whole set. The
    last group size must be the size of `process_set`. Every rank makes the groups' process sets
    together when this is built."""

    def __init__(self, period_group_size_dict: dict[int, int], warmup_steps: int = 0,
                 average_optimizer_state: bool = True, process_set: ProcessSet = global_process_set) -> None:
        self._groups = local_sgd.hierarchy(period_group_size_dict, process_set)
        super().__init__(min(self._groups), warmup_steps, average_optimizer_state, process_set)

    def _set_for(self, step):
        if step < self.warmup_steps:
            return self.process_set
        return local_sgd.group_after(self._groups, step, self.warmup_steps)
