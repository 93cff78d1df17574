"""The collectives on torch tensors: each tensor reaches the core as an array that shares its
memory (Tensor.numpy() on the CPU, DLPack to CuPy on the GPU), so nothing is copied on the way.

bfloat16, which numpy lacks, travels as float32 and is converted back.
"""

import ringreduce as core
import torch
from ringreduce.compression import Compression
from ringreduce.machine import gpu


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

    def __init__(self, handle, convert):
        self._handle = handle
        self._convert = convert

    def done(self):
        return self._handle.done()

    def wait(self):
        return self._convert(self._handle.wait())


def _out_of_place(tensor):
    return lambda result: as_tensor(result, tensor)


def _in_place(tensor, array):
    """The result is already in `tensor`'s memory, unless it went through a float32 copy."""
    def convert(_):
        if array.dtype.name == "float32" and tensor.dtype == torch.bfloat16:
            tensor.copy_(torch.from_numpy(array) if not tensor.is_cuda else torch.from_dlpack(array))
        return tensor
    return convert


def allreduce_async(tensor, op=None, name=None, compression=Compression.none, prescale_factor=1.0,
                    postscale_factor=1.0):
    handle = core.allreduce_async(tensor=as_array(tensor), op=_op(op), name=name, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, compression=compression)
    return Handle(handle, _out_of_place(tensor))


def allreduce_async_(tensor, op=None, name=None, compression=Compression.none, prescale_factor=1.0,
                     postscale_factor=1.0):
    array = as_array(tensor)
    handle = core.allreduce_async_(tensor=array, op=_op(op), name=name, prescale_factor=prescale_factor,
                                   postscale_factor=postscale_factor, compression=compression)
    return Handle(handle, _in_place(tensor, array))


def allreduce(tensor, op=None, name=None, compression=Compression.none, prescale_factor=1.0, postscale_factor=1.0):
    return allreduce_async(tensor, op, name, compression, prescale_factor, postscale_factor).wait()


def allreduce_(tensor, op=None, name=None, compression=Compression.none, prescale_factor=1.0,
               postscale_factor=1.0):
    return allreduce_async_(tensor, op, name, compression, prescale_factor, postscale_factor).wait()


def grouped_allreduce(tensors, op=None, name=None, compression=Compression.none, prescale_factor=1.0,
                      postscale_factor=1.0):
    results = core.grouped_allreduce(tensors=[as_array(t) for t in tensors], op=_op(op), name=name,
                                     prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                     compression=compression)
    return [as_tensor(result, tensor) for result, tensor in zip(results, tensors, strict=True)]


def allgather(tensor, name=None):
    return as_tensor(core.allgather(tensor=as_array(tensor), name=name), tensor)


def broadcast(tensor, root_rank, name=None):
    return as_tensor(core.broadcast(tensor=as_array(tensor), root_rank=root_rank, name=name), tensor)


def broadcast_(tensor, root_rank, name=None):
    array = as_array(tensor)
    if array.flags.c_contiguous and tensor.dtype != torch.bfloat16:
        core.broadcast_(tensor=array, root_rank=root_rank, name=name)
    else:
        tensor.copy_(broadcast(tensor, root_rank, name))
    return tensor


def alltoall(tensor, splits=None, name=None):
    result = core.alltoall(tensor=as_array(tensor), splits=None if splits is None else _ints(splits), name=name)
    if splits is None:
        return as_tensor(result, tensor)
    array, received = result
    return as_tensor(array, tensor), torch.from_numpy(received)


def reducescatter(tensor, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return as_tensor(core.reducescatter(tensor=as_array(tensor), op=_op(op), name=name, prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor), tensor)


def _op(op):
    return core.Average if op is None else op


def _ints(splits):
    return splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
