"""horovod.torch's, horovod.tensorflow's and horovod.tensorflow.keras's public calls, written
down from Horovod's API documentation (v0.28) as data, against ringreduce's bindings: the same
parameter names in the same order, and Horovod's defaults where Horovod has one (ringreduce may
add a default where Horovod has none: that breaks no call). Where ringreduce takes more than
Horovod (process_set= where Horovod's has none), the extra parameters come last and are listed
in EXTENSIONS (docs/horovod.md)."""

import inspect

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensorflow")

import ringreduce  # noqa: E402
import ringreduce.tensorflow as rr_tf  # noqa: E402
import ringreduce.tensorflow.keras as rr_keras  # noqa: E402
import ringreduce.torch as rr  # noqa: E402

SET = "process_set=global_process_set"
ALLREDUCE = f"tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, {SET}"
GROUPED_ALLREDUCE = f"tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, {SET}"
REDUCESCATTER = f"tensor, name=None, op=Average, {SET}, prescale_factor=1.0, postscale_factor=1.0"
GROUPED_REDUCESCATTER = f"tensors, name=None, op=Average, {SET}, prescale_factor=1.0, postscale_factor=1.0"
HOROVOD_TORCH = {
    "allreduce": "tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0, "
                 f"postscale_factor=1.0, {SET}",
    "allreduce_async": ALLREDUCE,
    "allreduce_": ALLREDUCE,
    "allreduce_async_": ALLREDUCE,
    "grouped_allreduce": "tensors, average=None, name=None, compression=Compression.none, op=None, "
                         f"prescale_factor=1.0, postscale_factor=1.0, {SET}",
    "grouped_allreduce_async": GROUPED_ALLREDUCE,
    "grouped_allreduce_": GROUPED_ALLREDUCE,
    "grouped_allreduce_async_": GROUPED_ALLREDUCE,
    "allgather": f"tensor, name=None, {SET}",
    "allgather_async": f"tensor, name=None, {SET}",
    "grouped_allgather": f"tensors, name=None, {SET}",
    "grouped_allgather_async": f"tensors, name=None, {SET}",
    "broadcast": f"tensor, root_rank, name=None, {SET}",
    "broadcast_async": f"tensor, root_rank, name=None, {SET}",
    "broadcast_": f"tensor, root_rank, name=None, {SET}",
    "broadcast_async_": f"tensor, root_rank, name=None, {SET}",
    "alltoall": f"tensor, splits=None, name=None, {SET}",
    "alltoall_async": f"tensor, splits=None, name=None, {SET}",
    "reducescatter": f"tensor, name=None, compression=Compression.none, op=Average, {SET}, prescale_factor=1.0, "
                     "postscale_factor=1.0",
    "reducescatter_async": REDUCESCATTER,
    "grouped_reducescatter": f"tensors, name=None, compression=Compression.none, op=Average, {SET}, "
                             "prescale_factor=1.0, postscale_factor=1.0",
    "grouped_reducescatter_async": GROUPED_REDUCESCATTER,
    "join": "device=-1",
    "barrier": SET,
    "poll": "handle",
    "synchronize": "handle",
    "init": "comm=None, process_sets=None",
    "shutdown": "",
    "is_initialized": "",
    "start_timeline": "file_path, mark_cycles=False",
    "stop_timeline": "",
    **dict.fromkeys(("size", "local_size", "cross_size", "rank", "local_rank", "cross_rank", "is_homogeneous",
                     "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
                     "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built"), ""),
    "broadcast_object": f"obj, root_rank=0, name=None, {SET}",
    "allgather_object": f"obj, name=None, {SET}",
    "broadcast_parameters": "params, root_rank, prefix=None",
    "broadcast_optimizer_state": "optimizer, root_rank, model=None",
    "DistributedOptimizer": "optimizer, named_parameters=None, compression=Compression.none, "
                            "backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0, num_groups=0, "
                            f"groups=None, sparse_as_dense=False, {SET}",
    # torch's _BatchNorm's, which Horovod's SyncBatchNorm inherits
    "SyncBatchNorm": "num_features, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True, device=None, "
                     "dtype=None",
}
# Shared by every binding (the calls that take no tensors).
NEUTRAL = {name: HOROVOD_TORCH[name] for name in (
    "join", "barrier", "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "rank",
    "local_size", "local_rank", "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported",
    "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "broadcast_object", "allgather_object")}
HOROVOD_TENSORFLOW = {
    **NEUTRAL,
    "allreduce": "tensor, average=None, device_dense='', device_sparse='', compression=Compression.none, op=None, "
                 f"prescale_factor=1.0, postscale_factor=1.0, name=None, {SET}, ignore_name_scope=False",
    "grouped_allreduce": "tensors, average=None, device_dense='', device_sparse='', compression=Compression.none, "
                         f"op=None, prescale_factor=1.0, postscale_factor=1.0, {SET}, ignore_name_scope=False, "
                         "name=None",
    "allgather": f"tensor, name=None, ignore_name_scope=False, {SET}",
    "grouped_allgather": f"tensors, name=None, ignore_name_scope=False, {SET}",
    "broadcast": f"tensor, root_rank, name=None, ignore_name_scope=False, {SET}",
    "broadcast_": f"variables, root_rank, name=None, {SET}",
    "alltoall": f"tensor, splits=None, name=None, ignore_name_scope=False, {SET}",
    "reducescatter": "tensor, device_dense='', compression=Compression.none, op=Average, name=None, "
                     f"{SET}, ignore_name_scope=False, prescale_factor=1.0, postscale_factor=1.0",
    "grouped_reducescatter": "tensors, device_dense='', compression=Compression.none, op=Average, "
                             f"{SET}, prescale_factor=1.0, postscale_factor=1.0",
    "size_op": "process_set_id=0, name=None",
    "local_size_op": "name=None",
    "rank_op": "name=None",
    "local_rank_op": "name=None",
    "broadcast_variables": f"variables, root_rank, {SET}, inplace=False",
    "broadcast_global_variables": "root_rank",
    "DistributedOptimizer": "optimizer, name=None, use_locking=False, device_dense='', device_sparse='', "
                            "compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1, "
                            "op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False, "
                            f"num_groups=0, groups=None, {SET}, scale_local_gradients=True",
    "DistributedGradientTape": "gradtape, device_dense='', device_sparse='', compression=Compression.none, "
                               "sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0, "
                               f"groups=None, {SET}, scale_local_gradients=True",
    "PartialDistributedGradientTape": "gradtape, device_dense='', device_sparse='', compression=Compression.none, "
                                      "sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, "
                                      f"num_groups=0, groups=None, {SET}, local_layers=None, "
                                      "scale_local_gradients=True",
}
HOROVOD_KERAS = {
    **NEUTRAL,
    "allreduce": "value, name=None, average=True, prescale_factor=1.0, postscale_factor=1.0, op=None, "
                 "compression=Compression.none",
    "allgather": "value, name=None",
    "broadcast": "value, root_rank, name=None",
    "reducescatter": "value, name=None, op=Average",
    "broadcast_global_variables": "root_rank",
    "DistributedOptimizer": "optimizer, name=None, device_dense='', device_sparse='', compression=Compression.none, "
                            "sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, "
                            "backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, "
                            f"groups=None, {SET}, scale_local_gradients=True",
    "PartialDistributedOptimizer": "optimizer, name=None, device_dense='', device_sparse='', "
                                   "compression=Compression.none, sparse_as_dense=False, "
                                   "gradient_predivide_factor=1.0, op=Average, groups=None, "
                                   f"{SET}, local_layers=None, scale_local_gradients=True",
    "BroadcastGlobalVariablesCallback": "root_rank, device='', local_variables=None",
    "MetricAverageCallback": "device=''",
    "LearningRateScheduleCallback": "initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True, "
                                    "momentum_correction=True, steps_per_epoch=None",
    "LearningRateWarmupCallback": "initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, "
                                  "verbose=0",
}
BINDINGS = {"torch": (rr, HOROVOD_TORCH), "tensorflow": (rr_tf, HOROVOD_TENSORFLOW),
            "keras": (rr_keras, HOROVOD_KERAS)}
HOROVOD_TORCH_NAMES = ("Compression", "Average", "Sum", "Adasum", "Min", "Max", "Product", "HorovodInternalError",
                       "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "SyncBatchNorm")


# What ringreduce takes beyond Horovod, after Horovod's parameters: process sets where Horovod's
# call has none.
EXTENSIONS = {
    ("torch", "join"): SET, ("torch", "broadcast_parameters"): SET, ("torch", "broadcast_optimizer_state"): SET,
    ("torch", "SyncBatchNorm"): f"{SET}, load_balancer=None", ("tensorflow", "join"): SET, ("keras", "join"): SET,
    # Stale averaging (docs/communication.md) and load balancing (docs/load_balancing.md), after
    # every argument of Horovod's.
    **{(binding, "DistributedOptimizer"): "staleness=0, weight_prediction=True, load_balancer=None"
       for binding in ("torch", "tensorflow", "keras")},
}


def horovod_parameters(text, binding):
    """[(name, default or inspect.Parameter.empty)] of a parameter list as Horovod documents it."""
    namespace = {"Compression": binding.Compression, "Average": binding.Average,
                 "global_process_set": binding.global_process_set}
    signature = inspect.signature(eval(f"lambda {text}: None", namespace))  # noqa: S307 - the table above
    return [(p.name, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize("binding, call", [(b, c) for b, (_, table) in BINDINGS.items() for c in sorted(table)])
def test_every_call_takes_horovods_parameters_in_horovods_order(binding, call):
    module, table = BINDINGS[binding]
    target = getattr(module, call)
    ours = list(inspect.signature(target.__init__ if inspect.isclass(target) else target).parameters.values())
    ours = [p for p in ours if p.name != "self"]
    theirs = horovod_parameters(", ".join(filter(None, (table[call], EXTENSIONS.get((binding, call))))), module)
    assert [p.name for p in ours] == [name for name, _ in theirs]
    for parameter, (name, default) in zip(ours, theirs, strict=True):
        if default is not inspect.Parameter.empty:
            assert parameter.default == default, name


def test_horovods_other_public_names_are_there():
    assert all(hasattr(rr, name) for name in HOROVOD_TORCH_NAMES)
    assert all(hasattr(module, name) for module in (rr_tf, rr_keras) for name in HOROVOD_TORCH_NAMES[:-1])
    assert issubclass(rr.HorovodInternalError, RuntimeError)
    assert issubclass(rr.MismatchError, rr.HorovodInternalError)


# torch.distributed's point-to-point calls (Horovod has none), with process_set= for group=.
POINT_TO_POINT = {"send": f"tensor, dst, {SET}, tag=0", "isend": f"tensor, dst, {SET}, tag=0",
                  "recv": f"tensor, src=None, {SET}, tag=0", "irecv": f"tensor, src=None, {SET}, tag=0"}


@pytest.mark.parametrize("module", [rr, rr_tf, ringreduce], ids=["torch", "tensorflow", "core"])
@pytest.mark.parametrize("call", sorted(POINT_TO_POINT))
def test_point_to_point_takes_torch_distributed_parameters(module, call):
    ours = [(p.name, p.default) for p in inspect.signature(getattr(module, call)).parameters.values()]
    assert ours == horovod_parameters(POINT_TO_POINT[call], rr)


# horovod.torch.elastic's and horovod.tensorflow.keras.elastic's classes and methods (Horovod's
# CommitStateCallback commits every batch by default; ringreduce's at epochs' ends: docs/elastic.md).
ELASTIC = {
    (rr.elastic.TorchState, "__init__"): "model=None, optimizer=None, **kwargs",
    (rr.elastic.ObjectState, "__init__"): "**kwargs",
    (rr.elastic.ElasticSampler, "__init__"): "dataset, shuffle=True, seed=0",
    (rr.elastic.ElasticSampler, "record_batch"): "batch_idx, batch_size",
    (rr.elastic.ElasticSampler, "set_epoch"): "epoch",
    (rr.elastic.TorchState, "register_reset_callbacks"): "callbacks",
    (rr_keras.elastic.KerasState, "__init__"): "model, optimizer=None, **kwargs",
    (rr_keras.elastic.CommitStateCallback, "__init__"): "state, batches_per_commit=None",
    (rr_keras.elastic.UpdateBatchStateCallback, "__init__"): "state",
    (rr_keras.elastic.UpdateEpochStateCallback, "__init__"): "state",
}


@pytest.mark.parametrize("owner, method", sorted(ELASTIC, key=str))
def test_elastic_classes_take_horovods_parameters(owner, method):
    ours = [p for p in inspect.signature(getattr(owner, method)).parameters.values() if p.name != "self"]
    theirs = inspect.signature(eval(f"lambda {ELASTIC[owner, method]}: None")).parameters.values()  # noqa: S307
    assert [(p.name, p.default, p.kind) for p in ours] == [(p.name, p.default, p.kind) for p in theirs]


def test_elastic_state_has_horovods_methods_and_names():
    for method in ("commit", "restore", "sync", "save", "check_host_updates", "register_reset_callbacks", "on_reset"):
        assert callable(getattr(rr.elastic.State, method))
    assert rr.elastic.run is rr_keras.elastic.run and rr.elastic.HostsUpdatedInterrupt is rr.HostsUpdatedInterrupt
    assert rr.HostsUpdatedInterrupt(skip_sync=True).skip_sync is True
