"""ringreduce for Keras (Keras 3 on TensorFlow), with the names, arguments and defaults of
horovod.tensorflow.keras: data-parallel model.fit in two lines.

    import ringreduce.tensorflow.keras as rr
    rr.init()
    model.compile(optimizer=rr.DistributedOptimizer(keras.optimizers.Adam(0.001 * rr.size())), loss=...)
    model.fit(x_shard, y_shard, callbacks=[rr.BroadcastGlobalVariablesCallback(0), rr.MetricAverageCallback()])
"""

from ringreduce.tensorflow import *  # noqa: F403 - everything of ringreduce.tensorflow, as Horovod's keras module

# Keras's own elastic module, optimizer and value collectives replace those names of ringreduce.tensorflow.
from ringreduce.tensorflow.keras import callbacks, elastic  # type: ignore[no-redef]  # noqa: F401
from ringreduce.tensorflow.keras.balancing import BalancedDataset  # noqa: F401
from ringreduce.tensorflow.keras.callbacks import (  # noqa: F401
    BroadcastGlobalVariablesCallback,
    HierarchicalLocalSGDCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    LocalSGDCallback,
    MetricAverageCallback,
)
from ringreduce.tensorflow.keras.optimizer import (  # type: ignore[assignment]  # noqa: F401
    DistributedOptimizer,
    PartialDistributedOptimizer,
)
from ringreduce.tensorflow.keras.values import (  # type: ignore[assignment]  # noqa: F401
    allgather,
    allreduce,
    broadcast,
    reducescatter,
)
