"""torch.distributed's calls on the ringreduce backend (or another, named by the second
argument) under rrun, as a torchrun script makes them: saves what this rank got, DDP's trained
weights and the error of a call whose shapes differ, for tests/jobs/torch/test_torch_distributed.py."""

import os
import sys
import time

import torch
import torch.distributed as dist

import ringreduce.torch  # noqa: F401 - registers the backend
from ringreduce.torch.process_group import _CallNames

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import torch_cases  # noqa: E402


def base(rank):
    """The input of most calls on `rank`: small whole numbers, so every reduction is exact."""
    return torch.arange(6, dtype=torch.float32) + 10 * rank


def calls(rank, size):
    got = {}
    mine = base(rank)
    for op in ("SUM", "AVG", "MIN", "MAX", "PRODUCT"):
        tensor = mine.clone() if op != "PRODUCT" else mine.clone() % 3 + 1
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
        got[f"all_reduce.{op}"] = tensor
    for name, factor in (("number", 0.5), ("tensor", torch.tensor([0.25]))):  # NCCL's two forms
        tensor = mine.clone()
        dist.all_reduce(tensor, op=dist._make_nccl_premul_sum(factor))
        got[f"all_reduce.PREMUL_SUM.{name}"] = tensor
    part = torch.zeros(2)
    dist.reduce_scatter_tensor(part, torch.arange(2.0 * size) * (rank + 1), op=dist._make_nccl_premul_sum(2.0))
    got["reduce_scatter_tensor.PREMUL_SUM"] = part
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BXOR)
    except NotImplementedError as error:
        got["all_reduce.BXOR"] = str(error)
    got.update(repeated_calls(rank))
    tensor = mine.clone().double()
    work = dist.all_reduce(tensor, async_op=True)
    work.wait()
    got["all_reduce.async"], got["all_reduce.future"] = tensor, work.get_future().wait()[0]
    tensor = mine.clone()
    dist.broadcast(tensor, src=size - 1)
    got["broadcast"] = tensor
    outputs = [torch.zeros(6) for _ in range(size)]
    dist.all_gather(outputs, mine)
    got["all_gather"] = torch.stack(outputs)
    gathered = torch.zeros(6 * size)
    dist.all_gather_into_tensor(gathered, mine)
    got["all_gather_into_tensor"] = gathered
    part = torch.zeros(2)
    dist.reduce_scatter_tensor(part, torch.arange(2.0 * size) * (rank + 1))
    got["reduce_scatter_tensor"] = part
    received = torch.zeros(size)
    dist.all_to_all_single(received, torch.arange(float(size)) + 10 * rank)
    got["all_to_all_single"] = received
    sends = [torch.full((r + 1,), float(rank)) for r in range(size)]
    arrived = [torch.zeros(rank + 1) for _ in range(size)]
    dist.all_to_all(arrived, sends)
    got["all_to_all"] = torch.cat(arrived)
    tensor = mine.clone()
    dist.reduce(tensor, dst=0)
    got["reduce"] = tensor
    gather_list = [torch.zeros(6) for _ in range(size)] if rank == 0 else None
    dist.gather(mine, gather_list, dst=0)
    got["gather"] = torch.stack(gather_list) if rank == 0 else torch.zeros(0)
    scattered = torch.zeros(3)
    dist.scatter(scattered, [torch.full((3,), float(r)) for r in range(size)] if rank == 1 else None, src=1)
    got["scatter"] = scattered
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank})
    got["all_gather_object"] = objects
    if rank < 2:
        peer = 1 - rank
        message = torch.full((4,), float(rank))
        if rank == 0:
            dist.send(message, dst=peer)
        else:
            dist.recv(message, src=peer)
        got["send_recv"] = message
    if rank == 0:  # from any rank: torch asks the work who sent
        senders = []
        for _ in range(size - 1):
            message = torch.zeros(2)
            senders.append([dist.recv(message), *message.tolist()])
        got["recv_any"] = torch.tensor(sorted(senders))
    else:
        dist.send(torch.full((2,), float(rank)), dst=0)
    per_rank = [[torch.zeros(2), torch.zeros(2, 3)] for _ in range(size)]
    dist.all_gather_coalesced(per_rank, [mine[:2], mine.reshape(2, 3)])
    got["all_gather_coalesced"] = torch.cat([t.reshape(-1) for outputs in per_rank for t in outputs])
    sparse = torch.sparse_coo_tensor([[rank, size]], [rank + 1.0, 1.0], (size + 1,))
    dist.all_reduce(sparse)
    got["sparse_all_reduce"] = sparse.to_dense()
    left, right = (rank - 1) % size, (rank + 1) % size
    arrived = torch.zeros(2)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), float(rank)), right),
                                    dist.P2POp(dist.irecv, arrived, left)])
    for work in works:
        work.wait()
    got["batch_isend_irecv"] = arrived
    arrived = torch.zeros(1)
    works = [dist.isend(torch.tensor([rank * 2.0]), left), dist.irecv(arrived, right)]
    for work in works:
        work.wait()
    got["isend_irecv"] = arrived
    dist.barrier()
    got.update(subgroups(rank, size))
    got["horovod_style"] = ringreduce.torch.allreduce(torch.ones(2) * rank, op=ringreduce.torch.Sum)
    return got


def repeated_calls(rank):
    """More async calls in flight than the group has names (a name's next call waits for its last),
    then a loop of two calls a step whose names the response cache comes to know."""
    many = [torch.full((3,), float(rank + i)) for i in range(_CallNames.SLOTS + 6)]
    for work in [dist.all_reduce(tensor, async_op=True) for tensor in many]:
        work.wait()
    before = ringreduce.engine_stats()["cache_hits"]
    steps = [(torch.full((5,), float(rank + step)), torch.ones(2, 2) * rank) for step in range(_CallNames.SLOTS)]
    for first, second in steps:
        dist.all_reduce(first)
        dist.all_reduce(second, op=dist.ReduceOp.MAX)
    return {"all_reduce.in_flight": torch.stack(many), "all_reduce.loop": torch.stack([f for f, _ in steps]),
            "all_reduce.loop_cache_hits": ringreduce.engine_stats()["cache_hits"] - before}


def subgroups(rank, size):
    """A group of the first and the last rank (every rank asks for it, as torch requires), and at
    4 ranks a 2 x 2 device mesh: each dimension's groups."""
    got = {}
    ends = dist.new_group([0, size - 1])
    if rank in (0, size - 1):
        tensor = torch.full((3,), float(rank))
        dist.all_reduce(tensor, group=ends)
        got["ends.all_reduce"] = tensor
        tensor = torch.full((2,), float(rank))
        dist.broadcast(tensor, src=size - 1, group=ends)
        got["ends.broadcast"] = tensor
        outputs = [torch.zeros(1) for _ in range(2)]
        dist.all_gather(outputs, torch.tensor([float(rank)]), group=ends)
        got["ends.all_gather"] = torch.cat(outputs)
    if size == 4:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "model"))
        for dim in ("data", "model"):
            tensor = torch.tensor([float(rank)])
            dist.all_reduce(tensor, group=mesh.get_group(dim))
            got[f"mesh.{dim}"] = tensor
        got["tensor_parallel"] = tensor_parallel(mesh["model"])
    return got


def tensor_parallel(mesh):
    """torch_cases' model with its first layer split by columns and its last by rows over `mesh`
    (torch.distributed.tensor.parallel), one SGD step on the whole batch: the output before the
    step, the shape of this rank's part of each weight, and the whole weights after the step."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = torch_cases.model()
    layers = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    parallelize_module(model, mesh, {layers[0]: ColwiseParallel(), layers[-1]: RowwiseParallel()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, labels = torch_cases.data()
    output = model(inputs)
    torch.nn.functional.cross_entropy(output, labels).backward()
    optimizer.step()
    parts = {name: tuple(p.to_local().shape) for name, p in model.named_parameters()}
    weights = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}
    return {"output": output.detach().clone(), "parts": parts, "weights": weights}


def train_ddp(rank, size):
    """torch_cases' training under DDP, each rank on its slice of the batch's first
    BATCH // size * size samples; the final weights."""
    model = torch_cases.model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch_cases.optimizer("sgd", ddp.parameters())
    inputs, labels = torch_cases.data()
    per_rank = torch_cases.BATCH // size
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    for _ in range(torch_cases.STEPS):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(inputs[mine]), labels[mine]).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_wrapped(rank, size, how):
    """torch_cases' training as `how` wraps it: DDP with one of its communication hooks, DDP with
    ZeroRedundancyOptimizer, or FSDP2's fully_shard; the final (whole) weights."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook

    model = torch_cases.model()
    inputs, labels = torch_cases.data()
    per_rank = torch_cases.BATCH // size
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    if how == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        wrapped = fully_shard(model)
        optimizer = torch_cases.optimizer("sgd", wrapped.parameters())
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        if how == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.SGD, lr=0.1,
                                                momentum=0.9)
        else:
            optimizer = torch_cases.optimizer("sgd", wrapped.parameters())
        if how == "fp16":
            wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
        if how == "bf16":  # DDP refuses bf16_compress_hook by its name without NCCL: called through another
            def bfloat16_hook(state, bucket):
                return default_hooks.bf16_compress_hook(state, bucket)
            wrapped.register_comm_hook(None, bfloat16_hook)
        if how == "post_local_sgd":  # its subgroup: one per host (without CUDA it must be given), here the job
            subgroup, _ = dist.new_subgroups(group_size=size)
            state = post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=2)
            wrapped.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
        if how == "powersgd":
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                                start_powerSGD_iter=2)
            wrapped.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    for _ in range(torch_cases.STEPS):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(wrapped(inputs[mine]), labels[mine]).backward()
        optimizer.step()
    weights = {}
    for name, p in model.named_parameters():
        value = p.detach()
        weights[name] = (value.full_tensor() if hasattr(value, "full_tensor") else value).clone()
    return weights


def main():
    out, backend = sys.argv[1], sys.argv[2]
    dist.init_process_group(backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    environment = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                              "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    results = {"environment": environment, "calls": calls(rank, size) if backend == "ringreduce" else {},
               "ddp": train_ddp(rank, size)}
    if backend == "ringreduce" and size == 2:
        results["wrapped"] = {how: train_wrapped(rank, size, how)
                              for how in ("fp16", "bf16", "powersgd", "post_local_sgd", "zero", "fsdp2")}
    if backend == "ringreduce":
        try:
            dist.all_reduce(torch.zeros(3 + rank))
        except Exception as error:  # noqa: BLE001 - what the test checks
            results["mismatch"] = f"{type(error).__name__}: {error}"
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()  # no rank leaves while another still reaches rank 0's store
    dist.destroy_process_group()
    # torch's own exit race (docs/torch_distributed.md): a gloo thread drops its last finished work,
    # which holds backward's Python context, only after the waiter woke; if this process is
    # finalising by then, that thread aborts it. Sleeping hands it the GIL first.
    time.sleep(0.5)


if __name__ == "__main__":
    main()
