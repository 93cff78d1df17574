"""ringreduce for TensorFlow: the collectives on tf.Tensor and tf.Variable (eagerly and inside
tf.function), DistributedGradientTape and broadcast_variables. Keras: ringreduce.tensorflow.keras.

    import ringreduce.tensorflow as rr
    rr.init()
    tape = rr.DistributedGradientTape(tape)
    rr.broadcast_variables(model.variables, root_rank=0)
"""

import ringreduce
from ringreduce.tensorflow.tape import DistributedGradientTape  # noqa: F401
from ringreduce.tensorflow.tensors import (  # noqa: F401
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allreduce,
    reducescatter,
)
from ringreduce.tensorflow.variables import broadcast_variables  # noqa: F401

globals().update((name, getattr(ringreduce, name)) for name in ringreduce.WITHOUT_ARRAYS)
