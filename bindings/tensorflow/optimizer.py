"""DistributedOptimizer for TensorFlow: a tf.compat.v1 optimizer whose compute_gradients()
averages the gradients over every rank, or for a Keras optimizer the Keras one."""

import typing

import keras

import ringreduce as core
import tensorflow as tf
from ringreduce.numerics.compression import CompressorLike
from ringreduce.ops import ReduceOp
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.tensorflow.compression import Compression
from ringreduce.tensorflow.tape import allreduce_gradients, is_variable
from ringreduce.training import options
from ringreduce.training.load_balancing import LoadBalancer


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps a tf.compat.v1.train.Optimizer; everything but compute_gradients is the wrapped one's."""

    def __init__(self, optimizer, name, use_locking, compression, sparse_as_dense, op, gradient_predivide_factor,
                 process_set):
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._combine = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                             gradient_predivide_factor=gradient_predivide_factor, process_set=process_set)

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's gradients, averaged over ranks."""
        gradients, variables = zip(*self._optimizer.compute_gradients(*args, **kwargs), strict=True)
        averaged = allreduce_gradients(list(gradients), variables, [v.name for v in variables], name=self.get_name(),
                                       **self._combine)
        return list(zip(averaged, variables, strict=True))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer: typing.Any, name: str | None = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: CompressorLike = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: ReduceOp = core.Average,
                         gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups: typing.Any = None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True, staleness: int = 0, weight_prediction: bool = True,
                         load_balancer: LoadBalancer | None = None) -> typing.Any:
    """`optimizer` with its gradients averaged over the ranks of `process_set`: a tf.compat.v1.train.Optimizer, or a
    Keras optimizer (then ringreduce.tensorflow.keras.DistributedOptimizer, as Horovod does)."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        from ringreduce.tensorflow.keras.optimizer import DistributedOptimizer as keras_optimizer

        return keras_optimizer(optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                               gradient_predivide_factor=gradient_predivide_factor, op=op,
                               backward_passes_per_step=backward_passes_per_step,
                               average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
                               num_groups=num_groups, groups=groups, staleness=staleness,
                               weight_prediction=weight_prediction, load_balancer=load_balancer)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError(f"expected a tf.compat.v1.train.Optimizer or a Keras optimizer, got {optimizer!r}")
    if backward_passes_per_step != 1:
        raise ValueError("backward_passes_per_step > 1 needs a Keras optimizer")
    if staleness or load_balancer is not None:
        raise ValueError("staleness=1 and load balancing need a Keras optimizer")
    options.check(op, compression, gradient_predivide_factor)
    options.groups(num_groups, groups, is_variable, "tf.Variable")
    return _DistributedOptimizer(optimizer, name, use_locking, compression, sparse_as_dense, op,
                                 gradient_predivide_factor, process_set)
