"""Making every rank start from the same variables."""

from collections.abc import Sequence

import tensorflow as tf
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.tensorflow import tensors


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0,
                        process_set: ProcessSet = global_process_set, inplace: bool = False) -> list:
    """Assign the root rank's values to every rank's variables (in one call per variable, named
    by position, so every rank must pass the same variables in the same order). `inplace` is
    Horovod's choice of kernel; the values assigned are the same either way."""
    variables = list(variables)
    for index, variable in enumerate(variables):
        if not isinstance(variable, tf.Variable) and not hasattr(variable, "assign"):
            raise TypeError(f"broadcast_variables: item {index} is a {type(variable).__name__}, not a variable")
    return tensors.broadcast_(variables, root_rank, name="broadcast_variables", process_set=process_set)


def broadcast_global_variables(root_rank: int) -> tf.Operation:
    """Assign the root rank's values to every global variable of a tf.compat.v1 graph; returns the
    graph's op. Eagerly there are no global variables: use broadcast_variables, as Horovod says."""
    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() does not support eager execution; "
                           "use broadcast_variables(<model/optimizer variables>) instead")
    return tf.group(*[v.assign(tensors.broadcast(v, root_rank)) for v in tf.compat.v1.global_variables()])
