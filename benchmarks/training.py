"""Training benchmark: two models trained with ringreduce's DistributedOptimizer and with torch
DistributedDataParallel on gloo, same model, same batch per rank, one thread per rank; and, as
the reference for efficiency, one plain process (no communication) using every core of the node
on the global batch.

    rrun -np 2 python benchmarks/training.py

The models: the synthetic CNN of examples/pytorch_synthetic_benchmark.py (94 K parameters,
whose step is nearly all computation) and an MLP of 3.2 M parameters (12.9 MB of gradients per
step, where communication counts). The two distributed variants alternate in rounds, each going
first in turn; the plain process runs on rank 0 while the other ranks wait. Prints images per
second, DDP's and the plain process's ratios, and writes benchmarks/results/training.json.
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from gloo import start_gloo
from torch.nn.parallel import DistributedDataParallel

import ringreduce.torch as rr

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from pytorch_synthetic_benchmark import small_cnn  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--steps-per-round", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rr.init()
    rank, size = rr.rank(), rr.size()
    start_gloo(rank, size)
    torch.manual_seed(0)
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))
    results = {name: measure(build, data, target, args, rank, size) for name, build in MODELS.items()}
    if rank == 0:
        report(results, size, args)


def mlp():
    """3.2 M parameters, nearly all in the first layer, whose gradient backward produces last."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 1024), nn.ReLU(), nn.Linear(1024, 64), nn.ReLU(),
                         nn.Linear(64, 10))


MODELS = {"small CNN": small_cnn, "MLP": mlp}


def measure(build, data, target, args, rank, size):
    """Images per second of the whole job: ringreduce's and DDP's, and the plain process's."""
    plain_rate = None
    if rank == 0:  # the reference: one process, all of the node's cores, the global batch
        torch.set_num_threads(os.cpu_count() or 1)
        plain_rate = images_per_second(*plain_trainer(build, data.repeat(size, 1, 1, 1), target.repeat(size)),
                                       args.steps_per_round * args.rounds // 2)
    rr.barrier()

    torch.set_num_threads(1)
    torch.manual_seed(1)
    model = build()
    ours = ringreduce_trainer(copy.deepcopy(model), data, target)
    theirs = ddp_trainer(copy.deepcopy(model), data, target)
    rates = {"ringreduce": [], "DDP on gloo": []}
    trainers = [("ringreduce", ours), ("DDP on gloo", theirs)]
    for round_ in range(args.rounds):
        for name, (step, images) in trainers[round_ % 2:] + trainers[:round_ % 2]:  # each goes first in turn
            rr.barrier()
            rates[name].append(images_per_second(step, images, args.steps_per_round))
    totals = {name: rr.allreduce(torch.tensor([statistics.median(r)], dtype=torch.float64), op=rr.Sum,
                                 name=f"rate.{name}").item() for name, r in rates.items()}
    return {"parameters": sum(p.numel() for p in model.parameters()), "images_per_second": totals,
            "plain_process_images_per_second": plain_rate}


def plain_trainer(build, data, target):
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return _stepper(model, optimizer, data, target), len(data)


def ringreduce_trainer(model, data, target):
    optimizer = rr.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                        named_parameters=model.named_parameters())
    rr.broadcast_parameters(model.state_dict(), root_rank=0)
    return _stepper(model, optimizer, data, target), len(data)


def ddp_trainer(model, data, target):
    model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return _stepper(model, optimizer, data, target), len(data)


def _stepper(model, optimizer, data, target):
    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
    step()  # warm-up
    return step


def images_per_second(step, images, steps):
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return images * steps / (time.perf_counter() - start)


def report(results, size, args):
    print(f"Training benchmark: batch {args.batch_size} per rank, {size} ranks with 1 thread each; "
          f"the plain process: {os.cpu_count()} threads, global batch")
    print(f"{'model':28s} {'ringreduce':>12s} {'DDP on gloo':>12s} {'vs DDP':>7s} {'plain':>12s} "
          f"{'efficiency':>10s} {'DDP eff.':>8s}")
    for name, result in results.items():
        ours, theirs = result["images_per_second"]["ringreduce"], result["images_per_second"]["DDP on gloo"]
        plain = result["plain_process_images_per_second"]
        label = f"{name} ({result['parameters'] / 1e6:.2f} M)"
        print(f"{label:28s} {ours:8.1f} img/s {theirs:6.1f} img/s {ours / theirs:6.2f}x {plain:6.1f} img/s "
              f"{ours / plain:10.2f} {theirs / plain:8.2f}")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "training.json"), "w") as f:
        json.dump({"ranks": size, "batch_per_rank": args.batch_size, "models": results}, f, indent=2)


if __name__ == "__main__":
    main()
