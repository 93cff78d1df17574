"""Making every rank start from the same variables."""

import tensorflow as tf
from ringreduce.tensorflow import tensors


def broadcast_variables(variables, root_rank=0, name="broadcast_variables"):
    """Assign the root rank's values to every rank's variables (in one call per variable, named
    by position, so every rank must pass the same variables in the same order)."""
    variables = list(variables)
    for index, variable in enumerate(variables):
        if not isinstance(variable, tf.Variable) and not hasattr(variable, "assign"):
            raise TypeError(f"broadcast_variables: item {index} is a {type(variable).__name__}, not a variable")
        variable.assign(tensors.broadcast(variable, root_rank, name=f"{name}.{index}"))
