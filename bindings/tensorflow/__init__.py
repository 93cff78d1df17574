"""ringreduce for TensorFlow: the collectives on tf.Tensor and tf.Variable (eagerly and inside
tf.function), DistributedGradientTape and broadcast_variables. Keras: ringreduce.tensorflow.keras.

    import ringreduce.tensorflow as rr
    rr.init()
    tape = rr.DistributedGradientTape(tape)
    rr.broadcast_variables(model.variables, root_rank=0)
"""

from ringreduce import (  # noqa: F401 - the core API, re-exported as Horovod's bindings do
    Average,
    Compression,
    Max,
    Min,
    MismatchError,
    NotInitializedError,
    PeerExitedError,
    Product,
    ReduceOp,
    RingReduceError,
    StallError,
    Sum,
    UnsupportedDtypeError,
)
from ringreduce.collectives import barrier, join  # noqa: F401
from ringreduce.objects import allgather_object, broadcast_object  # noqa: F401
from ringreduce.runtime import engine_stats, init, is_initialized, shutdown, straggler_report  # noqa: F401
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
from ringreduce.topology_api import cross_rank, cross_size, local_rank, local_size, rank, size  # noqa: F401
