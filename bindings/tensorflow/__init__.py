"""ringreduce for TensorFlow, with the names, arguments and defaults of horovod.tensorflow: the
collectives on tf.Tensor and tf.Variable (eagerly, inside tf.function and in tf.compat.v1
graphs), DistributedGradientTape, DistributedOptimizer and broadcast_variables. Keras:
ringreduce.tensorflow.keras.

    import ringreduce.tensorflow as rr
    rr.init()
    tape = rr.DistributedGradientTape(tape)
    rr.broadcast_variables(model.variables, root_rank=0)
"""

import ringreduce
from ringreduce.tensorflow.compression import Compression  # noqa: F401
from ringreduce.tensorflow.optimizer import DistributedOptimizer  # noqa: F401
from ringreduce.tensorflow.point_to_point import irecv, isend, recv, send  # noqa: F401
from ringreduce.tensorflow.tape import DistributedGradientTape, PartialDistributedGradientTape  # noqa: F401
from ringreduce.tensorflow.tensors import (  # noqa: F401
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    local_rank_op,
    local_size_op,
    rank_op,
    reducescatter,
    size_op,
)
from ringreduce.tensorflow.variables import broadcast_global_variables, broadcast_variables  # noqa: F401
from ringreduce.training.powersgd import PowerSGD  # noqa: F401

globals().update((name, getattr(ringreduce, name)) for name in ringreduce.WITHOUT_ARRAYS)

from ringreduce.tensorflow import elastic  # noqa: E402, F401 - last: its KerasState's module imports this one whole


def _executing_eagerly() -> bool:
    """Horovod's helper (horovod.tensorflow._executing_eagerly), which scripts written for it call."""
    import tensorflow as tf

    return tf.executing_eagerly()
