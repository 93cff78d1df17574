"""The digits MLP trained with each compression and averaging option, one after another in one job,
with fixed seeds; rank 0 reports each option's test accuracy. A compressor that drops the gradient is the
negative control: the test must see it fail. Usage: torch_convergence.py EPOCHS [SEEDS]: with SEEDS, each
option's accuracy for seeds 0 to SEEDS-1 (model initialisation and data order; docs/communication.md)."""

import json
import sys

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ringreduce.torch as rr
from ringreduce.numerics.compression import Compressor


class Drop(Compressor):
    """Sends zeros: no training signal crosses the wire."""

    @staticmethod
    def compress(tensor):
        return torch.zeros_like(tensor), None


def distributed(compression=rr.Compression.none, staleness=0, momentum=0.9):
    def make(model):
        local = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
        return rr.DistributedOptimizer(local, named_parameters=model.named_parameters(), compression=compression,
                                       staleness=staleness)
    return make


def local_sgd(period, compression=rr.Compression.none):
    return lambda model: rr.PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                                  rr.PeriodicModelAverager(period=period, compression=compression))


OPTIONS = {  # each makes a fresh optimizer (and compressor, whose state is per run)
    "none": lambda: distributed(),
    "fp16": lambda: distributed(rr.Compression.fp16),
    "bf16": lambda: distributed(rr.Compression.bf16),
    "error-feedback fp16": lambda: distributed(rr.Compression.error_feedback(rr.Compression.fp16)),
    "error-feedback bf16": lambda: distributed(rr.Compression.error_feedback(rr.Compression.bf16)),
    "PowerSGD rank 1": lambda: distributed(rr.PowerSGD(matrix_approximation_rank=1, start_powerSGD_iter=30)),
    "PowerSGD rank 4": lambda: distributed(rr.PowerSGD(matrix_approximation_rank=4, start_powerSGD_iter=30)),
    "top-k 1 % with error feedback": lambda: distributed(rr.Compression.error_feedback(rr.Compression.topk(0.01))),
    # DGC: the momentum moves from the optimizer into the compressor, before sparsification.
    "top-k 1 % with DGC's momentum correction": lambda: distributed(rr.Compression.dgc(0.01, momentum=0.9),
                                                                    momentum=0.0),
    "local SGD H=4": lambda: local_sgd(4),
    "local SGD H=4, changes as bf16": lambda: local_sgd(4, rr.Compression.bf16),
    "stale averaging": lambda: distributed(staleness=1),
    "drop (negative control)": lambda: distributed(Drop),
}


def accuracy(make_optimizer, epochs, data, seed=0):
    train_x, test_x, train_y, test_y = data
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = make_optimizer(model)  # SGD, lr 0.1, momentum 0.9 (DGC's in its compressor)
    for epoch in range(epochs):
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(epoch + 100 * seed))
        for start in range(0, len(order) - 63, 64):
            mine = order[start:start + 64][rr.rank()::rr.size()]
            optimizer.zero_grad()
            F.cross_entropy(model(train_x[mine]), train_y[mine]).backward()
            optimizer.step()
    if getattr(optimizer, "_staleness", 0):
        optimizer.synchronize()  # the last step's average, still in flight
    with torch.no_grad():
        return (model(test_x).argmax(1) == test_y).float().mean().item() * 100


rr.init()
torch.set_num_threads(1)
digits = load_digits()
x, y = torch.tensor(digits.data, dtype=torch.float32) / 16.0, torch.tensor(digits.target)
data = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
epochs, seeds = int(sys.argv[1]), range(int(sys.argv[2])) if len(sys.argv) > 2 else None
if seeds is None:
    results = {name: accuracy(make(), epochs, data) for name, make in OPTIONS.items()}
else:
    results = {name: [accuracy(make(), epochs, data, seed) for seed in seeds] for name, make in OPTIONS.items()}
if rr.rank() == 0:
    print("REPORT " + json.dumps(results), flush=True)
