"""The collectives on torch tensors: each tensor reaches the core as an array that shares its
memory (Tensor.numpy() on the CPU, DLPack to CuPy on the GPU), so nothing is copied on the way.

bfloat16, which numpy lacks, travels as float32 and is converted back.
"""

import ringreduce as core
import torch
from ringreduce import gpu, runtime
from ringreduce.compression import Compression


def as_array(tensor):
    """The array the core works on: shares memory with `tensor` unless it is bfloat16."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    if tensor.is_cuda:
        # DLPack makes CuPy's current stream wait for torch's, so the core's ready event covers
        # the work that produced the tensor.
        return gpu.require_cupy("a CUDA tensor").from_dlpack(tensor)
    return tensor.numpy()


def as_tensor(array, like):
    """The core's result as a tensor of `like`'s dtype and device."""
    if type(array).__module__.split(".")[0] == "cupy":
        tensor = torch.from_dlpack(array)
    else:
        tensor = torch.from_numpy(array)
    return tensor if tensor.dtype == like.dtype else tensor.to(like.dtype)


class Handle:
    """A core handle whose result is turned back into a tensor (or written into one)."""

    def __init__(self, handle, finish):
        self._handle = handle
        self._finish = finish

    def done(self):
        return self._handle.done()

    def wait(self):
        return self._finish(self._handle.wait())


def _out_of_place(tensor):
    return lambda result: as_tensor(result, tensor)


def _in_place(tensor, array):
    """The result is already in `tensor`'s memory, unless it went through a float32 copy."""
    def finish(_):
        if array.dtype.name == "float32" and tensor.dtype == torch.bfloat16:
            tensor.copy_(torch.from_numpy(array) if not tensor.is_cuda else torch.from_dlpack(array))
        return tensor
    return finish


def allreduce_async(tensor, op=None, name=None, compression=Compression.none, prescale_factor=1.0,
                    postscale_factor=1.0):
    handle = core.allreduce_async(as_array(tensor), _op(op), name, prescale_factor, postscale_factor, compression)
    return Handle(handle, _out_of_place(tensor))


def allreduce_async_(tensor, op=None, name=None, compression=Compression.none, prescale_factor=1.0,
                     postscale_factor=1.0):
    array = as_array(tensor)
    handle = core.allreduce_async_(array, _op(op), name, prescale_factor, postscale_factor, compression)
    return Handle(handle, _in_place(tensor, array))


def allreduce(tensor, op=None, name=None, compression=Compression.none, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(allreduce_async(tensor, op, name, compression, prescale_factor, postscale_factor))


def allreduce_(tensor, op=None, name=None, compression=Compression.none, prescale_factor=1.0,
               postscale_factor=1.0):
    return synchronize(allreduce_async_(tensor, op, name, compression, prescale_factor, postscale_factor))


def grouped_allreduce(tensors, op=None, name=None, compression=Compression.none, prescale_factor=1.0,
                      postscale_factor=1.0):
    base = name or runtime.active().auto_name()
    handles = [allreduce_async(t, op, f"{base}.{i}", compression, prescale_factor, postscale_factor)
               for i, t in enumerate(tensors)]
    return [synchronize(h) for h in handles]


def allgather(tensor, name=None):
    return as_tensor(core.allgather(as_array(tensor), name), tensor)


def broadcast(tensor, root_rank, name=None):
    return as_tensor(core.broadcast(as_array(tensor), root_rank, name), tensor)


def broadcast_(tensor, root_rank, name=None):
    array = as_array(tensor)
    if array.flags.c_contiguous and tensor.dtype != torch.bfloat16:
        core.broadcast_(array, root_rank, name)
    else:
        tensor.copy_(broadcast(tensor, root_rank, name))
    return tensor


def alltoall(tensor, splits=None, name=None):
    result = core.alltoall(as_array(tensor), None if splits is None else _ints(splits), name)
    if splits is None:
        return as_tensor(result, tensor)
    array, received = result
    return as_tensor(array, tensor), torch.from_numpy(received)


def reducescatter(tensor, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return as_tensor(core.reducescatter(as_array(tensor), _op(op), name, prescale_factor, postscale_factor), tensor)


def synchronize(handle):
    return handle.wait()


def poll(handle):
    return handle.done()


def _op(op):
    return core.Average if op is None else op


def _ints(splits):
    return splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
