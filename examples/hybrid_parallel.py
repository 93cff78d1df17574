"""Hybrid parallel training on scikit-learn's handwritten digits: tensor parallelism inside groups
of ranks, data parallelism across them.

    rrun -np 4 python examples/hybrid_parallel.py      # 2 data-parallel groups x 2 tensor-parallel ranks

The model is a perceptron whose first layer every rank holds whole and whose next two are split
across the ranks of a tensor-parallel group (a ColumnParallelLinear, then a RowParallelLinear:
one allreduce forward, one backward);
each group trains on its share of every global batch, and a DistributedOptimizer on the
data-parallel set averages the gradients of each shard over the groups. The result is the model
that one process would train on the global batch: `--save` writes its whole weights (rank 0).
"""

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ringreduce.torch as rr

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tensor-parallel", type=int, default=2, help="ranks per tensor-parallel group")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=64, help="global")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--hidden", type=int, default=128)
parser.add_argument("--save", help="write the whole model's weights here (rank 0), after training")
args = parser.parse_args()

rr.init()
tp = args.tensor_parallel
if rr.size() % tp:
    raise SystemExit(f"{rr.size()} ranks do not make groups of {tp}")
groups = rr.size() // tp
# Every rank makes every set, in the same order: the tensor-parallel groups of consecutive ranks,
# and the data-parallel sets of the ranks at the same place in each group.
tensor_sets = [rr.add_process_set(range(g * tp, (g + 1) * tp)) for g in range(groups)]
data_sets = [rr.add_process_set(range(t, rr.size(), tp)) for t in range(tp)]
tensor_set, data_set = tensor_sets[rr.rank() // tp], data_sets[rr.rank() % tp]
torch.set_num_threads(max(1, (os.cpu_count() or 1) // rr.local_size()))


def whole_model():
    """The single-process model this job splits; the same on every rank (a fixed seed)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, args.hidden),
                               torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))


def digits():
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target)
    return train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)


whole = whole_model()
model = torch.nn.Sequential(
    whole[0], torch.nn.ReLU(),  # whole on every rank
    rr.ColumnParallelLinear.from_linear(whole[2], process_set=tensor_set, gather_output=False),
    torch.nn.ReLU(),
    rr.RowParallelLinear.from_linear(whole[4], process_set=tensor_set, input_is_parallel=True),
)
optimizer = rr.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                    named_parameters=model.named_parameters(), process_set=data_set)

train_x, test_x, train_y, test_y = digits()
share = args.batch_size // groups  # each group's part of the global batch
group = rr.rank() // tp
step_seconds = []  # after the first epoch, for `make bench`
for epoch in range(args.epochs):
    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(epoch))
    for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
        started = time.perf_counter()
        mine = order[start + group * share:start + (group + 1) * share]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(train_x[mine]), train_y[mine])
        loss.backward()
        optimizer.step()
        if epoch:
            step_seconds.append(time.perf_counter() - started)
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item() * 100
    if rr.rank() == 0:
        print(f"epoch {epoch + 1:2d}  loss {loss.item():.4f}  test accuracy {accuracy:.1f}%", flush=True)


def gathered(tensor, dim):
    """The whole weight from the tensor-parallel group's parts."""
    parts = rr.allgather(tensor.detach().movedim(dim, 0).contiguous(), process_set=tensor_set)
    return parts.movedim(0, dim)


state = {"0.weight": model[0].weight.detach(), "0.bias": model[0].bias.detach(),
         "2.weight": gathered(model[2].weight, 0), "2.bias": gathered(model[2].bias, 0),
         "4.weight": gathered(model[4].weight, 1), "4.bias": model[4].bias.detach()}
if args.save and rr.rank() == 0:
    torch.save(state, args.save)
if rr.rank() == 0:
    step = f", {statistics.median(step_seconds) * 1e3:.2f} ms per training step" if step_seconds else ""
    print(f"{groups} data-parallel groups x {tp} tensor-parallel ranks: test accuracy {accuracy:.1f}%{step}")
