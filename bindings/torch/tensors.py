"""The collectives on torch tensors, with Horovod's signatures: each tensor reaches the core as an
array that shares its memory (Tensor.numpy() on the CPU, DLPack to CuPy on the GPU), so nothing
is copied on the way. bfloat16 CUDA tensors travel as bfloat16 where the GPU can carry it (CuPy
14 with ml_dtypes); on the CPU, where numpy lacks it, bfloat16 travels as float32 and is
converted back.

The plain out-of-place collectives are differentiable (autograd.py); the async and in-place
forms are not, as in Horovod.
"""

from collections.abc import Callable, Sequence

import numpy as np

import ringreduce as core
import torch
from ringreduce import ops
from ringreduce.machine import gpu
from ringreduce.numerics import compression as compressors
from ringreduce.numerics import device_kernels
from ringreduce.ops import ReduceOp
from ringreduce.process_sets import ProcessSet, global_process_set


def as_array(tensor):
    """The array the core works on: shares memory with `tensor`, unless it is a bfloat16 tensor
    on the CPU or on a GPU that cannot carry bfloat16 (a float32 copy then)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    tensor = tensor.detach()
    if not tensor.is_cuda:
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    # DLPack makes CuPy's current stream wait for torch's, so the core's ready event covers the
    # work that produced the tensor.
    cupy = gpu.require_cupy("a CUDA tensor")
    if tensor.dtype != torch.bfloat16:
        return cupy.from_dlpack(tensor)
    with cupy.cuda.Device(tensor.device.index):
        carried = device_kernels.bfloat16_unavailable(cupy) is None
    if not carried:
        return cupy.from_dlpack(tensor.float())
    # The bits go through DLPack as int16: CuPy's DLPack takes bfloat16 only since cupy#9670.
    return cupy.from_dlpack(tensor.view(torch.int16)).view(compressors.bfloat16())


def as_tensor(array, like):
    """The core's result as a tensor of `like`'s dtype and device."""
    if type(array).__module__.split(".")[0] != "cupy":
        tensor = torch.from_numpy(array)
    elif array.dtype.name == "bfloat16":
        tensor = torch.from_dlpack(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_dlpack(array)
    return tensor if tensor.dtype == like.dtype else tensor.to(like.dtype)


class Handle:
    """A core handle whose result is turned back into a tensor (or written into one, or a list of
    them for a grouped call)."""

    def __init__(self, handle, convert):
        self._handle = handle
        self._convert = convert

    def done(self):
        return self._handle.done()

    def wait(self, timeout: float | None = None):
        return self._convert(self._handle.wait(timeout))


def _out_of_place(tensor):
    return lambda result: as_tensor(result, tensor)


def _in_place(tensor, array):
    """The result is already in `tensor`'s memory, unless it went through a float32 copy."""
    def convert(_):
        if array.dtype.name == "float32" and tensor.dtype == torch.bfloat16:
            tensor.copy_(torch.from_numpy(array) if not tensor.is_cuda else torch.from_dlpack(array))
        return tensor
    return convert


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start combining `tensor` over every rank of `process_set` (Average by default); the handle
    gives a new tensor."""
    return engine_allreduce_async(tensor, ops.from_average(op, average), name, prescale_factor, postscale_factor,
                                  process_set=process_set)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """allreduce_async into `tensor` itself."""
    return engine_allreduce_async_(tensor, ops.from_average(op, average), name, prescale_factor, postscale_factor,
                                   process_set=process_set)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: ReduceOp | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set).wait()


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """allreduce_async of several tensors submitted together, so that they fuse."""
    return engine_grouped_allreduce_async(tensors, ops.from_average(op, average), name, prescale_factor,
                                          postscale_factor, process_set=process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> Handle:
    arrays = [as_array(t) for t in tensors]
    handle = core.grouped_allreduce_async_(tensors=arrays, op=ops.from_average(op, average), name=name,
                                           prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                           process_set=process_set)
    converts = [_in_place(t, a) for t, a in zip(tensors, arrays, strict=True)]
    return Handle(handle, lambda results: [convert(r) for convert, r in zip(converts, results, strict=True)])


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                    process_set).wait()


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start concatenating every rank's `tensor` along the first dimension."""
    return Handle(core.allgather_async(tensor=as_array(tensor), name=name, process_set=process_set),
                  _out_of_place(tensor))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    handle = core.grouped_allgather_async(tensors=[as_array(t) for t in tensors], name=name, process_set=process_set)
    return Handle(handle, _each_out_of_place(tensors))


class SparseAllreduce:
    """A sparse COO tensor combined over ranks by gathering every rank's indices and values
    (Horovod's way for sparse gradients, top-k's, and gloo's sparse all_reduce); wait() hands the
    combined, coalesced sparse tensor to `finish` (Average divides the values by the size)."""

    def __init__(self, sparse: torch.Tensor, name: str, op: ReduceOp, process_set: ProcessSet,
                 finish: Callable[[torch.Tensor], object]) -> None:
        if op not in (core.Sum, core.Average):
            raise ValueError(f"a sparse gradient ({name!r}) can be summed or averaged, not reduced with {op!r}")
        sparse = sparse.coalesce()
        self._finish, self._average, self._shape = finish, op == core.Average, sparse.shape
        self._size = process_set.size()
        self._indices = allgather_async(sparse.indices().t().contiguous(), f"{name}.indices", process_set)
        self._values = allgather_async(sparse.values().contiguous(), f"{name}.values", process_set)

    def done(self):
        return self._indices.done() and self._values.done()

    def wait(self, timeout: float | None = None):
        values = self._values.wait(timeout)
        if self._average:
            values = values / self._size
        combined = torch.sparse_coo_tensor(self._indices.wait(timeout).t(), values, self._shape,
                                           check_invariants=False).coalesce()
        self._finish(combined)
        return combined


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start copying the root rank's `tensor` (a global rank) to every rank of `process_set`; the
    handle gives a new tensor."""
    return Handle(core.broadcast_async(tensor=as_array(tensor), root_rank=root_rank, name=name,
                                       process_set=process_set), _out_of_place(tensor))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """broadcast_async into `tensor` itself (through a copy where it is not contiguous)."""
    array = as_array(tensor)
    if array.flags.c_contiguous and tensor.dtype != torch.bfloat16:
        return Handle(core.broadcast_async_(tensor=array, root_rank=root_rank, name=name, process_set=process_set),
                      lambda _: tensor)
    copy = broadcast_async(tensor, root_rank, name, process_set)
    return Handle(copy, lambda result: tensor.copy_(result))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


def alltoall_async(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start sending block j of the first dimension to rank j (of `process_set`). With `splits`
    (rows per rank) the handle gives (tensor, rows received from each rank), as Horovod's."""
    return alltoall_pair_async(tensor, splits, name, process_set, pair=splits is not None)


def alltoall_pair_async(tensor, splits, name, process_set, pair):
    """alltoall_async, whose handle gives (tensor, rows received) where `pair` (the rows an
    alltoall's gradient sends back by)."""
    handle = core.alltoall_async(tensor=as_array(tensor), splits=None if splits is None else _ints(splits), name=name,
                                 process_set=process_set, return_splits=pair)
    if not pair:
        return Handle(handle, _out_of_place(tensor))
    return Handle(handle, lambda result: (as_tensor(result[0], tensor), torch.from_numpy(result[1])))


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = core.Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    """Start combining every rank's `tensor` and keep this rank's share of the first dimension."""
    handle = core.reducescatter_async(tensor=as_array(tensor), op=op, name=name, prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor, process_set=process_set)
    return Handle(handle, _out_of_place(tensor))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: ReduceOp = core.Average, process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    handle = core.grouped_reducescatter_async(tensors=[as_array(t) for t in tensors], op=op, name=name,
                                              prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                              process_set=process_set)
    return Handle(handle, _each_out_of_place(tensors))


def engine_allreduce_async(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0,
                           compression=compressors.Compression.none, process_set=global_process_set):
    """allreduce_async with the op decided and the engine's own compression (for autograd.py)."""
    handle = core.allreduce_async(tensor=as_array(tensor), op=op, name=name, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, compression=compression,
                                  process_set=process_set)
    return Handle(handle, _out_of_place(tensor))


def engine_allreduce(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0,
                     compression=compressors.Compression.none, process_set=global_process_set):
    """engine_allreduce_async(...).wait() as one plain call, which is faster for a small tensor and,
    unnamed, repeats its name so that the response cache knows it (for autograd.py and layers)."""
    result = core.allreduce(tensor=as_array(tensor), op=op, name=name, prescale_factor=prescale_factor,
                            postscale_factor=postscale_factor, compression=compression, process_set=process_set)
    return as_tensor(result, tensor)


def plain_allgather(tensor, name=None, process_set=global_process_set):
    """allgather_async(...).wait() as one plain call (see engine_allreduce)."""
    return as_tensor(core.allgather(tensor=as_array(tensor), name=name, process_set=process_set), tensor)


def engine_allreduce_async_(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0,
                            compression=compressors.Compression.none, process_set=global_process_set):
    array = as_array(tensor)
    handle = core.allreduce_async_(tensor=array, op=op, name=name, prescale_factor=prescale_factor,
                                   postscale_factor=postscale_factor, compression=compression,
                                   process_set=process_set)
    return Handle(handle, _in_place(tensor, array))


def engine_grouped_allreduce_async(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0,
                                   compression=compressors.Compression.none, process_set=global_process_set):
    handle = core.grouped_allreduce_async(tensors=[as_array(t) for t in tensors], op=op, name=name,
                                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                          compression=compression, process_set=process_set)
    return Handle(handle, _each_out_of_place(tensors))


def _each_out_of_place(tensors):
    return lambda results: [as_tensor(r, t) for r, t in zip(results, tensors, strict=True)]


def _ints(splits):
    return splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
