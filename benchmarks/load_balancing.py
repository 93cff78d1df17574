"""Uneven ranks: samples per second of the training benchmark's MLP when the last rank is twice as
slow (it computes every batch twice, on a copy of the model: a device of half the speed), with the
global batch split evenly and split by ringreduce's LoadBalancer, against the fast rank training
the whole global batch alone. The ideal of balancing 2 ranks of speeds 1 and 1/2 is 1.5x the even
split (the slow rank's half of the batch takes twice as long as the fast rank's; a third of it
takes as long as the other two thirds), less what the communication costs, which balancing does
not shrink.

    rrun -np 2 python benchmarks/load_balancing.py

The variants take turns in rounds, each round in a rotated order; a variant's rate is the median of
its rounds', and the balanced job's gain the median of the rounds' ratios (each of two runs a few
seconds apart: this machine's speed drifts more than that between rounds). Writes
benchmarks/results/load_balancing.json.
"""

import argparse
import copy
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from training import MODELS

import ringreduce.torch as rr

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


class Trainer:
    """A model and its optimizer, training on this rank's part of the global batch: `mode` "even",
    "balanced", or "alone" (all of it, without the other rank)."""

    def __init__(self, model, data, target, mode, slow):
        self.model, self.data, self.target, self.mode, self.slow = model, data, target, mode, slow
        self.shadow = copy.deepcopy(model)  # the slow rank's second computation, outside the optimizer
        self.global_batch = len(data)
        local = torch.optim.SGD(model.parameters(), lr=0.01)
        self.balancer = rr.LoadBalancer(self.global_batch, interval=5) if mode == "balanced" else None
        self.optimizer = local if mode == "alone" else rr.DistributedOptimizer(
            local, named_parameters=model.named_parameters(), load_balancer=self.balancer)

    def batch(self):
        if self.mode == "alone":
            return slice(0, self.global_batch)
        if self.mode == "even":
            share = self.global_batch // rr.size()
            return slice(rr.rank() * share, (rr.rank() + 1) * share)
        offset, count = self.balancer.take(self.balancer.steps or 0, self.global_batch)
        return slice(offset, offset + count)

    def step(self):
        mine = self.batch()
        if self.slow:
            self.shadow.zero_grad()
            F.cross_entropy(self.shadow(self.data[mine]), self.target[mine]).backward()
        self.optimizer.zero_grad()
        F.cross_entropy(self.model(self.data[mine]), self.target[mine]).backward()
        self.optimizer.step()


def rate(trainer, steps):
    """Global samples per second over `steps` steps."""
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    return steps * trainer.global_batch / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="small CNN")
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--steps-per-round", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    rr.init()
    if rr.size() != 2:
        raise SystemExit("run it on 2 ranks: rrun -np 2 python benchmarks/load_balancing.py")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data, target = torch.randn(args.global_batch, 3, 32, 32), torch.randint(0, 10, (args.global_batch,))
    model = MODELS[args.model]()
    slow = rr.rank() == 1
    trainers = {"even split": Trainer(copy.deepcopy(model), data, target, "even", slow),
                "balanced": Trainer(copy.deepcopy(model), data, target, "balanced", slow)}
    for trainer in trainers.values():  # warm-up; the balancer finds the split
        rate(trainer, 25)
    rates = {name: [] for name in trainers}
    names = list(trainers)
    for round_ in range(args.rounds):
        for name in names[round_ % 2:] + names[:round_ % 2]:
            rr.barrier()
            rates[name].append(rate(trainers[name], args.steps_per_round))
    alone = None
    if rr.rank() == 0:  # the fast rank alone with the whole global batch, the slow one waiting
        single = Trainer(copy.deepcopy(model), data, target, "alone", False)
        rate(single, 3)
        alone = statistics.median(rate(single, args.steps_per_round) for _ in range(args.rounds))
    rr.barrier()
    if rr.rank() == 0:
        gains = [b / e for b, e in zip(rates["balanced"], rates["even split"], strict=True)]
        report({name: statistics.median(r) for name, r in rates.items()}, alone, gains,
               trainers["balanced"].balancer.shares.tolist(), args)


def report(rates, alone, gains, shares, args):
    even, balanced = rates["even split"], rates["balanced"]
    print(f"Uneven ranks: the {args.model}, global batch {args.global_batch}, 2 ranks, rank 1 twice as slow")
    print(f"{'variant':28s} {'samples/s':>10s} {'x even':>7s}")
    for name, value in (("even split", even), ("balanced", balanced), ("fast rank alone", alone)):
        print(f"{name:28s} {value:10.0f} {value / even:7.2f}")
    print(f"balanced against even, round by round: median {statistics.median(gains):.2f}x "
          f"(from {min(gains):.2f} to {max(gains):.2f}; ideal 1.5)")
    print(f"balanced shares: {shares[0]:.3f} / {shares[1]:.3f} (ideal 0.667 / 0.333)")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "load_balancing.json"), "w") as f:
        json.dump({"model": args.model, "global_batch": args.global_batch,
                   "samples_per_second": {**rates, "fast rank alone": alone},
                   "balanced_over_even_per_round": gains, "shares": shares}, f, indent=2)


if __name__ == "__main__":
    main()
