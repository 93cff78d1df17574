"""Collectives on CuPy arrays (and CUDA torch tensors); saves host copies of the results.
Usage: gpu.py OUT_DIR [mismatch]"""

import os
import sys

import cupy
import numpy as np
from ml_dtypes import bfloat16

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import gpu_cases  # noqa: E402

import ringreduce as rr  # noqa: E402
from ringreduce import runtime  # noqa: E402
from ringreduce.training.powersgd import PowerSGD  # noqa: E402

import cases  # noqa: E402

rr.init()
rank, size = rr.rank(), rr.size()
if sys.argv[2:] == ["mismatch"]:  # numpy on rank 0, CuPy elsewhere: every rank gets the same error
    array = cases.values(rank, "float32", 8)
    try:
        rr.allreduce(array if rank == 0 else cupy.asarray(array), name="mixed")
    except rr.MismatchError as error:
        print(f"caught: {error}")
    rr.shutdown()
    sys.exit(0)


def on_gpu(result):
    """A result's host copy, once checked to be on this rank's GPU and, with the emulated CuPy, made
    on the caller's stream (CuPy's pool would reuse a block made on the engine's stream there, in
    the next collective, while the caller's stream may still read it)."""
    assert isinstance(result, cupy.ndarray), type(result)
    assert result.device.id == cupy.cuda.Device().id
    assert getattr(result, "_stream", 0) == 0, "a result made on the engine's stream"
    return result.get()


def bits(result):
    """A bfloat16 result's bits (np.savez keeps no ml_dtypes dtype), once checked to be bfloat16."""
    assert result.dtype == bfloat16, result.dtype
    return on_gpu(result).view(np.uint16)


out = {"device": np.array(cupy.cuda.Device().id), "transport": np.array(runtime.active().gpu_transport)}
for dtype in ("float32", "float64", "int64", "int16", "uint8"):
    out[f"allreduce-{dtype}"] = on_gpu(rr.allreduce(cupy.asarray(cases.values(rank, dtype, 1001)), op=rr.Sum))
out["allreduce-average"] = on_gpu(rr.allreduce(cupy.asarray(cases.values(rank, "float32", 1001))))
out["allreduce-scaled"] = on_gpu(rr.allreduce(cupy.asarray(cases.values(rank, "float32", 1001)), op=rr.Sum,
                                              prescale_factor=0.5, postscale_factor=3.0))
out["allreduce-fp16"] = on_gpu(rr.allreduce(cupy.asarray(cases.normal(rank, "float32", 1001)), op=rr.Sum,
                                            compression=rr.Compression.fp16))
out["allreduce-bf16"] = on_gpu(rr.allreduce(cupy.asarray(cases.normal(rank, "float32", 1001)), op=rr.Sum,
                                            compression=rr.Compression.bf16))
# bfloat16 arrays travel as themselves (NCCL's ncclBfloat16; staged through ml_dtypes' on the host).
nccl_datatypes = getattr(cupy.cuda.nccl, "datatypes", None)  # what the emulated NCCL was called with
if nccl_datatypes is not None:
    nccl_datatypes.clear()
out["bfloat16-sum"] = bits(rr.allreduce(cupy.asarray(cases.values(rank, "float32", 1001).astype(bfloat16)),
                                          op=rr.Sum))
out["bfloat16-average"] = bits(rr.allreduce(cupy.asarray(cases.values(rank, "float32", 1001).astype(bfloat16))))
out["bfloat16-allgather"] = bits(rr.allgather(cupy.asarray(cases.values(rank, "float32", 6).astype(bfloat16))))
out["bfloat16-broadcast"] = bits(rr.broadcast(cupy.asarray(cases.values(rank, "float32", 9).astype(bfloat16)),
                                                root_rank=size - 1))
out["bfloat16-reducescatter"] = bits(rr.reducescatter(
    cupy.asarray(cases.values(rank, "float32", 15).astype(bfloat16).reshape(5, 3)), op=rr.Sum))
if size > 1:  # point to point carries bfloat16's bytes
    if rank == 0:
        rr.send(cupy.asarray(cases.values(0, "float32", 7).astype(bfloat16)), 1)
    elif rank == 1:
        received = cupy.zeros(7, bfloat16)
        rr.recv(received, 0)
        out["bfloat16-recv"] = bits(received)
if nccl_datatypes is not None:
    out["nccl-bfloat16"] = np.array(cupy.cuda.nccl.NCCL_BFLOAT16 in nccl_datatypes)
try:
    rr.allreduce(np.ones(3, bfloat16))
except rr.UnsupportedDtypeError as error:
    out["host-bfloat16-refused"] = np.array(str(error))
out["allreduce-bool-max"] = on_gpu(rr.allreduce(cupy.asarray(cases.values(rank, "bool", 77)), op=rr.Max))
lengths = (1, 1000, 33, 0, 4097)
group = rr.grouped_allreduce([cupy.asarray(cases.values(rank, "float32", n, salt=i)) for i, n in enumerate(lengths)],
                             op=rr.Sum)
for i, result in enumerate(group):
    out[f"grouped-{i}"] = on_gpu(result)
half = rr.grouped_allreduce([cupy.asarray(cases.normal(rank, "float32", n)) for n in lengths], op=rr.Average,
                            compression=rr.Compression.fp16, name="half")
for i, result in enumerate(half):
    out[f"grouped-fp16-{i}"] = on_gpu(result)
in_place = cupy.asarray(cases.values(rank, "float64", 33))
rr.allreduce_(in_place, op=rr.Max)
out["allreduce_-max"] = in_place.get()
strided = cupy.asarray(cases.values(rank, "float32", 64).reshape(8, 8)).T  # not contiguous
out["allreduce-strided"] = on_gpu(rr.allreduce(strided, op=rr.Sum))
out["allgather"] = on_gpu(rr.allgather(cupy.asarray(cases.values(rank, "int32", 2 * (rank + 1)).reshape(rank + 1, 2))))
out["broadcast"] = on_gpu(rr.broadcast(cupy.asarray(cases.values(rank, "float32", 10)), root_rank=size - 1))
target = cupy.asarray(cases.values(rank, "float32", 10))
rr.broadcast_(target, root_rank=0)
out["broadcast_"] = target.get()
out["reducescatter"] = on_gpu(rr.reducescatter(cupy.asarray(cases.values(rank, "float32", 5 * 3).reshape(5, 3)),
                                               op=rr.Sum))
out["alltoall"] = on_gpu(rr.alltoall(cupy.asarray(np.full((2 * size, 2), rank, np.int64))))
# Waited for while the engine thread runs it (the plain call above may run on this thread).
out["alltoall-async"] = on_gpu(rr.synchronize(rr.alltoall_async(cupy.asarray(np.full((2 * size, 2), rank, np.int64)))))
# PowerSGD on the GPU, at a rank at which it is exact.
gradients = {"w": cupy.asarray(gpu_cases.low_rank_matrix(rank)), "b": cupy.asarray(cases.values(rank, "float32", 10))}
PowerSGD(matrix_approximation_rank=2, start_powerSGD_iter=0).average(gradients)
for name, array in gradients.items():
    out[f"powersgd-{name}"] = on_gpu(array)

torch = gpu_cases.cuda_torch()
if torch is not None:
    import ringreduce.torch as rrt

    tensor = torch.as_tensor(cases.values(rank, "float32", 100), device="cuda") * 1  # made on torch's stream
    result = rrt.allreduce(tensor, op=rrt.Sum)
    assert result.is_cuda, result.device
    out["torch-allreduce"] = result.cpu().numpy()
    brain = torch.as_tensor(cases.values(rank, "float32", 100), device="cuda").to(torch.bfloat16)
    rrt.allreduce_(brain, op=rrt.Sum)  # in place: the result lands in the tensor, whichever way it travelled
    out["torch-bfloat16"] = brain.float().cpu().numpy()
    # What it travelled as: bfloat16 wherever this GPU runs CuPy's bfloat16 kernel.
    from ringreduce.numerics import device_kernels
    from ringreduce.torch.tensors import as_array

    out["torch-bfloat16-carried"] = np.array(device_kernels.bfloat16_unavailable(cupy) is None)
    out["torch-bfloat16-travels-as"] = np.array(as_array(brain).dtype.name)
    model = torch.nn.Linear(4, 3).cuda()
    torch.nn.init.constant_(model.weight, float(rank))
    rrt.broadcast_parameters(model.state_dict(), root_rank=0)
    out["torch-broadcast"] = model.weight.detach().cpu().numpy()
np.savez(os.path.join(sys.argv[1], f"rank{rank}.npz"), **out)
rr.shutdown()
