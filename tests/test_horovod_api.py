"""horovod.torch's public calls, written down from Horovod's API documentation (v0.28) as data,
against ringreduce.torch's: the same parameter names in the same order, and Horovod's defaults
where Horovod has one (ringreduce may add a default where Horovod has none: that breaks no call).
`process_set=` is left out everywhere: process sets are not offered yet (docs/horovod.md)."""

import inspect

import pytest

torch = pytest.importorskip("torch")

import ringreduce.torch as rr  # noqa: E402

ALLREDUCE = "tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0"
GROUPED_ALLREDUCE = "tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0"
REDUCESCATTER = "tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0"
GROUPED_REDUCESCATTER = "tensors, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0"
HOROVOD_TORCH = {
    "allreduce": "tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0, "
                 "postscale_factor=1.0",
    "allreduce_async": ALLREDUCE,
    "allreduce_": ALLREDUCE,
    "allreduce_async_": ALLREDUCE,
    "grouped_allreduce": "tensors, average=None, name=None, compression=Compression.none, op=None, "
                         "prescale_factor=1.0, postscale_factor=1.0",
    "grouped_allreduce_async": GROUPED_ALLREDUCE,
    "grouped_allreduce_": GROUPED_ALLREDUCE,
    "grouped_allreduce_async_": GROUPED_ALLREDUCE,
    "allgather": "tensor, name=None",
    "allgather_async": "tensor, name=None",
    "grouped_allgather": "tensors, name=None",
    "grouped_allgather_async": "tensors, name=None",
    "broadcast": "tensor, root_rank, name=None",
    "broadcast_async": "tensor, root_rank, name=None",
    "broadcast_": "tensor, root_rank, name=None",
    "broadcast_async_": "tensor, root_rank, name=None",
    "alltoall": "tensor, splits=None, name=None",
    "alltoall_async": "tensor, splits=None, name=None",
    "reducescatter": "tensor, name=None, compression=Compression.none, op=Average, prescale_factor=1.0, "
                     "postscale_factor=1.0",
    "reducescatter_async": REDUCESCATTER,
    "grouped_reducescatter": "tensors, name=None, compression=Compression.none, op=Average, prescale_factor=1.0, "
                             "postscale_factor=1.0",
    "grouped_reducescatter_async": GROUPED_REDUCESCATTER,
    "join": "device=-1",
    "barrier": "",
    "poll": "handle",
    "synchronize": "handle",
    "init": "comm=None",
    "shutdown": "",
    "is_initialized": "",
    "start_timeline": "file_path, mark_cycles=False",
    "stop_timeline": "",
    **dict.fromkeys(("size", "local_size", "cross_size", "rank", "local_rank", "cross_rank", "is_homogeneous",
                     "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
                     "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built"), ""),
    "broadcast_object": "obj, root_rank=0, name=None",
    "allgather_object": "obj, name=None",
    "broadcast_parameters": "params, root_rank, prefix=None",
    "broadcast_optimizer_state": "optimizer, root_rank, model=None",
    "DistributedOptimizer": "optimizer, named_parameters=None, compression=Compression.none, "
                            "backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0, num_groups=0, "
                            "groups=None, sparse_as_dense=False",
}
HOROVOD_TORCH_NAMES = ("Compression", "Average", "Sum", "Adasum", "Min", "Max", "Product", "HorovodInternalError",
                       "SyncBatchNorm")


def horovod_parameters(text):
    """[(name, default or inspect.Parameter.empty)] of a parameter list as Horovod documents it."""
    namespace = {"Compression": rr.Compression, "Average": rr.Average}
    signature = inspect.signature(eval(f"lambda {text}: None", namespace))  # noqa: S307 - the table above
    return [(p.name, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize("call", sorted(HOROVOD_TORCH))
def test_every_call_takes_horovods_parameters_in_horovods_order(call):
    ours = list(inspect.signature(getattr(rr, call)).parameters.values())
    theirs = horovod_parameters(HOROVOD_TORCH[call])
    assert [p.name for p in ours] == [name for name, _ in theirs]
    for parameter, (name, default) in zip(ours, theirs, strict=True):
        if default is not inspect.Parameter.empty:
            assert parameter.default == default, name


def test_horovods_other_public_names_are_there():
    assert all(hasattr(rr, name) for name in HOROVOD_TORCH_NAMES)
    assert issubclass(rr.HorovodInternalError, RuntimeError)
    assert issubclass(rr.MismatchError, rr.HorovodInternalError)
