"""Elastic training with Keras, under horovod.tensorflow.keras.elastic's names: KerasState keeps the
model's weights, its optimizer's variables and plain values; three callbacks keep state.batch and
state.epoch up to date and commit during fit (see ringreduce.elastic).

    state = rr.elastic.KerasState(model, batch=0, epoch=0)

    @rr.elastic.run
    def train(state):
        model.fit(dataset, steps_per_epoch=steps, epochs=epochs, initial_epoch=state.epoch,
                  callbacks=[rr.elastic.CommitStateCallback(state, batches_per_commit=10),
                             rr.elastic.UpdateBatchStateCallback(state), rr.elastic.UpdateEpochStateCallback(state)])
"""

from typing import Any

import keras

from ringreduce.elastic import ObjectState, State, run  # noqa: F401 - Horovod's names, here too
from ringreduce.errors import HostsUpdatedInterrupt  # noqa: F401


class KerasState(State):
    """The model's weights, the optimizer's variables (the model's compiled optimizer unless one is
    given; built before loading, so a fresh process can take them), and keyword values as
    attributes (`state.epoch`, `state.batch`)."""

    epoch: int  # kept by UpdateEpochStateCallback, given as a keyword value
    batch: int  # kept by UpdateBatchStateCallback, given as a keyword value

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None, **kwargs) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._names = tuple(kwargs)
        self.__dict__.update(kwargs)
        super().__init__()

    def _state(self):
        optimizer = self._built_optimizer()
        return {"weights": self.model.get_weights(),
                "optimizer": None if optimizer is None else [v.numpy() for v in optimizer.variables],
                "values": {name: getattr(self, name) for name in self._names}}

    def _load(self, state):
        self.model.set_weights(state["weights"])
        optimizer = self._built_optimizer()
        if optimizer is not None and state["optimizer"] is not None:
            for variable, value in zip(optimizer.variables, state["optimizer"], strict=True):
                variable.assign(value)
        self.__dict__.update(state["values"])

    def _built_optimizer(self):
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(self.model.trainable_variables)
        return self.optimizer


class CommitStateCallback(keras.callbacks.Callback):
    """Commit every `batches_per_commit` batches and at each epoch's end, with state.batch and
    state.epoch (where the state has them) already counting what is done, whatever the order of
    the callbacks. fit() starts an epoch from its first batch: a job resumed from a commit inside an
    epoch takes that epoch's first batches again unless the dataset skips state.batch batches (commit
    at epochs' ends, the default of batches_per_commit=None, to need nothing of the dataset)."""

    def __init__(self, state: KerasState, batches_per_commit: int | None = None) -> None:
        super().__init__()
        self.state, self.batches_per_commit = state, batches_per_commit
        self._batches = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batches += 1
        if self.batches_per_commit and self._batches % self.batches_per_commit == 0:
            _count(self.state, batch=batch + 1)
            self.state.commit()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        _count(self.state, batch=0, epoch=epoch + 1)
        self.state.commit()


def _count(state, **values):
    for name, value in values.items():
        if hasattr(state, name):
            setattr(state, name, value)


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """state.batch: the batches done in this epoch (0 again at each epoch's end)."""

    def __init__(self, state: KerasState) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """state.epoch: the epochs done."""

    def __init__(self, state: KerasState) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.epoch = epoch + 1
