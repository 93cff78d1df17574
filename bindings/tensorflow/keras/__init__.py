"""ringreduce for Keras (Keras 3 on TensorFlow), with the names, arguments and defaults of
horovod.tensorflow.keras: data-parallel model.fit in two lines.

    import ringreduce.tensorflow.keras as rr
    rr.init()
    model.compile(optimizer=rr.DistributedOptimizer(keras.optimizers.Adam(0.001 * rr.size())), loss=...)
    model.fit(x_shard, y_shard, callbacks=[rr.BroadcastGlobalVariablesCallback(0), rr.MetricAverageCallback()])
"""

from ringreduce.tensorflow import *  # noqa: F403 - everything of ringreduce.tensorflow, as Horovod's keras module
from ringreduce.tensorflow.keras import callbacks, elastic  # noqa: F401
from ringreduce.tensorflow.keras.balancing import BalancedDataset  # noqa: F401
from ringreduce.tensorflow.keras.callbacks import (  # noqa: F401
    BroadcastGlobalVariablesCallback,
    HierarchicalLocalSGDCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    LocalSGDCallback,
    MetricAverageCallback,
)
from ringreduce.tensorflow.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer  # noqa: F401
from ringreduce.tensorflow.keras.values import allgather, allreduce, broadcast, reducescatter  # noqa: F401
