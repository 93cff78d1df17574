"""ringreduce.torch called the way Horovod's users call horovod.torch; saves what each call gave.
Usage: horovod_torch.py OUT_DIR: each part (calls, grads) to OUT_DIR/PART/rankR.pt."""

import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import torch_cases  # noqa: E402

import ringreduce.torch as hvd  # noqa: E402

import cases  # noqa: E402

hvd.init()
out = sys.argv[1]
rank, size = hvd.rank(), hvd.size()
x = torch_cases.contribution(rank)


class Doubling(hvd.Compression.none):
    """A compressor of the user's own: sends twice the values, halves them back."""

    calls = 0

    @staticmethod
    def compress(tensor):
        Doubling.calls += 1
        return tensor * 2, "doubled"

    @staticmethod
    def decompress(tensor, ctx):
        assert ctx == "doubled"
        return tensor / 2


def calls(results):
    # Horovod's positional order: tensor, average, name, compression, op, prescale, postscale.
    results["positional"] = hvd.allreduce(x, None, "positional", hvd.Compression.none, hvd.Sum, 2.0, 0.5)
    in_place = x.clone()
    hvd.allreduce_(in_place, None, "positional_", hvd.Sum)
    results["positional_"] = in_place
    results["reducescatter"] = hvd.reducescatter(x, "rs", hvd.Compression.none, hvd.Sum)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results["average-false"] = hvd.allreduce(x, average=False)
        results["average-true"] = hvd.allreduce(x, average=True)
    results["warned"] = torch.tensor([issubclass(w.category, DeprecationWarning) for w in caught])
    try:
        hvd.allreduce(x, average=True, op=hvd.Sum)
    except ValueError as error:
        results["both"] = str(error)
    results["grouped_allreduce_"] = hvd.grouped_allreduce_([x.clone(), x[:2].clone()], op=hvd.Sum)
    results["grouped_allgather"] = hvd.grouped_allgather([x[:rank + 1], x[:1]])
    results["grouped_reducescatter"] = hvd.grouped_reducescatter([x, x * 2], op=hvd.Sum)
    handles = {
        "allgather_async": hvd.allgather_async(x[:rank + 1]),
        "broadcast_async": hvd.broadcast_async(x, root_rank=size - 1),
        "reducescatter_async": hvd.reducescatter_async(x, op=hvd.Sum),
        "grouped_allreduce_async": hvd.grouped_allreduce_async([x, x], op=hvd.Sum),
        "grouped_allgather_async": hvd.grouped_allgather_async([x[:1]]),
        "grouped_reducescatter_async": hvd.grouped_reducescatter_async([x], op=hvd.Sum),
        "alltoall_async": hvd.alltoall_async(torch.arange(size * 2.0) + 10 * rank),
    }
    results.update({name: hvd.synchronize(handle) for name, handle in handles.items()})
    submissions = {"allreduce": lambda: hvd.allreduce_async(x, name="twice.allreduce"),
                   "allgather": lambda: hvd.allgather_async(x, name="twice.allgather"),
                   "broadcast": lambda: hvd.broadcast_async(x, 0, name="twice.broadcast"),
                   "reducescatter": lambda: hvd.reducescatter_async(x, name="twice.reducescatter")}
    for kind, submit in submissions.items():  # Horovod refuses a name in flight at the second submission
        first = submit()
        try:
            submit()
        except ValueError as error:
            results[f"twice-{kind}"] = str(error)
        hvd.synchronize(first)
    target = x.clone()
    hvd.synchronize(hvd.broadcast_async_(target, 0))
    results["broadcast_async_"] = target
    results["compressed"] = hvd.allreduce(x, compression=Doubling, op=hvd.Sum)
    results["compressor_calls"] = torch.tensor(Doubling.calls)
    results["fp16"] = hvd.allreduce(x, compression=hvd.Compression.fp16, op=hvd.Sum)
    results["fp16_compress"] = torch.tensor(hvd.Compression.fp16.compress(x)[0].dtype == torch.float16)
    try:
        hvd.allreduce(torch.ones(rank + 2), name="mismatched")
    except hvd.HorovodInternalError as error:
        results["internal_error"] = str(error)
    try:
        hvd.allreduce(x, op=hvd.Adasum)
    except ValueError as error:
        results["adasum"] = str(error)
    time.sleep(0.3 * rank)  # the ranks join in rank order: the last rank joins last
    results["joined"] = torch.tensor(hvd.join(device=-1))
    # While rank 0 has joined, an integer Average truncates toward zero, as Horovod's: -(2r + 1) from
    # each other rank, divided by the size.
    if rank == 0:
        results["joined_last"] = torch.tensor(hvd.join())
    else:
        results["int_average"] = hvd.allreduce(torch.tensor([-(2 * rank + 1)], dtype=torch.int32), name="int.join")
        results["joined_last"] = torch.tensor(hvd.join())
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    unnamed = hvd.DistributedOptimizer(torch.optim.SGD([{"params": net[0].parameters()},
                                                        {"params": net[1].parameters()}], lr=0.1))
    results["parameter_names"] = sorted(unnamed._parameter_names.values())
    net(torch.ones(1, 2)).sum().backward()
    unnamed.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unnamed.step()
    results["step_warning"] = [str(w.message) for w in caught]
    # An optimizer on a set without this rank trains alone: its step is the plain SGD step.
    first = hvd.add_process_set([0]) if size > 1 else hvd.global_process_set
    alone = torch.nn.Linear(2, 1)
    with torch.no_grad():
        alone.weight.fill_(1.0)
    outside = hvd.DistributedOptimizer(torch.optim.SGD(alone.parameters(), lr=1.0),
                                       named_parameters=alone.named_parameters(), process_set=first)
    alone(torch.full((1, 2), rank + 1.0)).sum().backward()
    outside.step()
    results["outside_weight"] = alone.weight.detach().clone()
    hvd.remove_process_set(first)
    results["built"] = torch.tensor([hvd.mpi_built(), hvd.mpi_enabled(), hvd.gloo_built(), hvd.nccl_built() != 0,
                                     hvd.cuda_built(), hvd.is_homogeneous(), hvd.mpi_threads_supported()])
    hvd.start_timeline(os.path.join(out, "timeline.json"))
    hvd.allreduce(x, name="timed")
    hvd.stop_timeline()


def grads(results):
    weights = torch_cases.weights(rank)
    for op, label in ((hvd.Sum, "sum"), (hvd.Average, "average")):
        leaf = x.clone().requires_grad_()
        (hvd.allreduce(leaf, op=op) * weights).sum().backward()
        results[f"allreduce-{label}"] = leaf.grad
    leaf = x[:rank + 1].clone().requires_grad_()
    gathered = hvd.allgather(leaf)
    (gathered * torch_cases.weights(rank, len(gathered))).sum().backward()
    results["allgather"] = leaf.grad
    leaf = x.clone().requires_grad_()
    (hvd.broadcast(leaf, root_rank=size - 1) * weights).sum().backward()
    results["broadcast"] = leaf.grad
    leaf = x.clone().requires_grad_()
    scattered = hvd.reducescatter(leaf, op=hvd.Sum)
    (scattered * weights[:len(scattered)]).sum().backward()
    results["reducescatter"] = leaf.grad
    leaf = x.clone().requires_grad_()
    exchanged, received = hvd.alltoall(leaf, splits=cases.splits(rank, size))
    (exchanged * torch_cases.weights(rank, len(exchanged))).sum().backward()
    results["alltoall"] = leaf.grad
    results["alltoall-received"] = received
    leaf = torch.from_numpy(cases.equal_split_contribution(rank, size)).requires_grad_()
    exchanged = hvd.alltoall(leaf)
    (exchanged * torch_cases.weights(rank, len(exchanged))).sum().backward()
    results["alltoall-equal"] = leaf.grad
    first, second = x.clone().requires_grad_(), x.clone().requires_grad_()
    summed = hvd.grouped_allreduce([first, second], op=hvd.Sum)
    (summed[0] * weights + summed[1] * 2 * weights).sum().backward()
    results["grouped"] = torch.stack([first.grad, second.grad])


for part in (calls, grads):
    os.makedirs(os.path.join(out, part.__name__), exist_ok=True)
    results = {}
    part(results)
    torch.save(results, os.path.join(out, part.__name__, f"rank{rank}.pt"))
