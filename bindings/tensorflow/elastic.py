"""Elastic training with TensorFlow, under horovod.tensorflow.elastic's names: TensorFlowState keeps
variables' values and plain values (see ringreduce.elastic); Keras models: KerasState, in
ringreduce.tensorflow.keras.elastic (also here, as in Horovod).

    state = rr.elastic.TensorFlowState(model.variables, batch=0, epoch=0)

    @rr.elastic.run
    def train(state):
        ...
        state.commit()
"""

from collections.abc import Sequence

import tensorflow as tf
from ringreduce.elastic import ObjectState, State, run  # noqa: F401 - Horovod's names, here too
from ringreduce.errors import HostsUpdatedInterrupt  # noqa: F401
from ringreduce.tensorflow.keras.elastic import KerasState

TensorFlowKerasState = KerasState  # Horovod's name for it here


class TensorFlowState(State):
    """Eager TensorFlow variables (tf.Variable or Keras's), and keyword values as attributes
    (`state.epoch`, `state.batch`)."""

    def __init__(self, variables: Sequence[tf.Variable] | None = None, session: object = None, **kwargs) -> None:
        if session is not None:
            raise ValueError("TensorFlowState keeps eager variables; a tf.compat.v1 Session is not supported")
        self.variables = list(variables or [])
        self._names = tuple(kwargs)
        self.__dict__.update(kwargs)
        super().__init__()

    def _state(self):
        return {"variables": [v.numpy() for v in self.variables],
                "values": {name: getattr(self, name) for name in self._names}}

    def _load(self, state):
        for variable, value in zip(self.variables, state["variables"], strict=True):
            variable.assign(value)
        self.__dict__.update(state["values"])
