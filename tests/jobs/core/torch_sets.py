"""Two data-parallel groups of two ranks (process sets [0, 1] and [2, 3]) under ringreduce.torch:
each group broadcasts its first rank's parameters and trains on its own half of the data with a
DistributedOptimizer on its set; and a row-parallel product whose partial results are summed by a
differentiable allreduce on the set. Saves the parameters and gradients. Usage: torch_sets.py OUT_DIR"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import torch_cases  # noqa: E402

import ringreduce.torch as rr  # noqa: E402

rr.init()
rank = rr.rank()
groups = [rr.add_process_set([0, 1]), rr.add_process_set([2, 3])]
group = groups[rank // 2]
out = {}

net = torch_cases.model()
if group.rank() != 0:  # diverged starting points: the broadcast on the set must fix them
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.add_(rank)
rr.broadcast_parameters(net.state_dict(), root_rank=group.ranks[0], process_set=group)
opt = rr.DistributedOptimizer(torch_cases.optimizer("adam", net.parameters()), named_parameters=net.named_parameters(),
                              process_set=group)
rr.broadcast_optimizer_state(opt, root_rank=group.ranks[0], process_set=group)
half = torch_cases.BATCH // 2
shard = half // group.size()
start = half * (rank // 2) + shard * group.rank()
out.update(torch_cases.train(net, opt, [(start, start + shard)]))

# Row-parallel: this rank holds rows of W (and the matching columns of x); the set sums the parts.
x, w = torch_cases.tensor_parallel_inputs()
cols = x.shape[1] // group.size()
mine = slice(group.rank() * cols, (group.rank() + 1) * cols)
w_part = w[mine].clone().requires_grad_(True)
y = rr.allreduce(x[:, mine] @ w_part, op=rr.Sum, process_set=group)
(y * y).sum().backward()
out["y"], out["w_grad"] = y.detach(), w_part.grad
gathered = rr.allgather(torch.full((group.rank() + 1,), float(rank)), process_set=group)
out["allgather"] = gathered
# The tensor-parallel layers with whole inputs and outputs: the values and gradients of one Linear.
for kind, layer in (("column", rr.ColumnParallelLinear), ("row", rr.RowParallelLinear)):
    x = torch_cases.tensor_parallel_inputs()[0].requires_grad_(True)
    options = {"gather_output": True} if kind == "column" else {"input_is_parallel": False}
    split = layer.from_linear(torch_cases.linear(), process_set=group, **options)
    y = split(x)
    (y * y).sum().backward()
    out[f"{kind}-y"], out[f"{kind}-x_grad"], out[f"{kind}-w_grad"] = y.detach(), x.grad, split.weight.grad
# SyncBatchNorm on the set: the statistics of the group's batches together.
norm = rr.SyncBatchNorm(3, process_set=group)
x = torch_cases.batch_norm_input(rank).requires_grad_(True)
y = norm(x)
(y * torch_cases.batch_norm_input(rank + 20)).sum().backward()
out["norm-y"], out["norm-x_grad"], out["norm-running_mean"] = y.detach(), x.grad, norm.running_mean

# Point-to-point within each group: the first rank sends to the second, in float32 and bfloat16.
if group.rank() == 0:
    rr.send(torch.arange(6.0).reshape(2, 3) + rank, group.ranks[1], process_set=group, tag=3)
    rr.isend(torch.full((4,), rank + 0.5, dtype=torch.bfloat16), group.ranks[1], process_set=group).wait()
else:
    into, half = torch.zeros(2, 3), torch.zeros(4, dtype=torch.bfloat16)
    out["recv-from"] = torch.tensor(rr.recv(into, process_set=group, tag=3))
    out["recv"] = into
    work = rr.irecv(half, group.ranks[0], process_set=group)
    out["irecv-from"] = torch.tensor(work.wait())
    out["irecv"] = half
torch.save(out, os.path.join(sys.argv[1], f"rank{rank}.pt"))
