"""numpy on the CPU, CuPy on the GPU: arrays told apart by their type's module, so that nothing
here imports CuPy (slow, and it may have no GPU to use), and new arrays of either kind.

A CuPy array arrives as it is (a CUDA torch tensor reaches one by DLPack, without a copy).
"""

import numpy as np

from ringreduce.machine.memory import RECYCLER


def on_device(array):
    """A CuPy array?"""
    return type(array) is not np.ndarray and type(array).__module__.split(".")[0] == "cupy"


def device_of(array):
    """Where an array lives, as the ranks compare it: "cuda" for CuPy, else "cpu"."""
    return "cuda" if on_device(array) else "cpu"


def module_of(array):
    """numpy, or cupy for a CuPy array: the functions that create arrays like this one."""
    if on_device(array):
        import cupy

        return cupy
    return np


def to_host(array):
    return array.get() if on_device(array) else array


def like(host, model):
    """`host` as an array of the same kind as `model` (copied to the GPU for a CuPy model, on the
    model's GPU: the engine thread's current device may be another)."""
    if not on_device(model):
        return host
    with model.device:
        return module_of(model).asarray(host)


def device_copy(array):
    """A new C-contiguous copy of a CuPy array, on its GPU."""
    with array.device:
        return module_of(array).array(array, order="C", copy=True)


def new_like(array, shape=None):
    """An uninitialized result of `array`'s kind and dtype (host results come from RECYCLER)."""
    shape = array.shape if shape is None else shape
    if on_device(array):
        with array.device:
            return module_of(array).empty(shape, dtype=array.dtype)
    return RECYCLER.empty(shape, array.dtype)
