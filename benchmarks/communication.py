"""Communication-efficient training: time and bytes on the wire per step of the training
benchmark's MLP (3.2 M parameters, 12.9 MB of gradients) for each of ringreduce's options, against
synchronous averaging, torch DDP on gloo with and without its PowerSGD hook, and the ranks' local
steps with no communication at all (the best any option can do: the efficiency's reference).

    rrun -np 2 python benchmarks/communication.py                         # one machine
    rrun -H hosta:1,hostb:1 python benchmarks/communication.py --link "1 Gbit/s"   # the test cluster

The variants run in rounds, each round in a rotated order; a variant's time is the median of its
rounds' mean step times (local SGD's rounds hold whole periods). Bytes are what this rank put into
the engine's collectives per step in one more, untimed round (ringreduce's variants). Writes
benchmarks/results/communication[-LINK].json.
"""

import argparse
import copy
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from gloo import start_gloo
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel
from training import mlp

import ringreduce.torch as rr

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def ours(make_optimizer):
    def build(model):
        return model, make_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.01))
    return build


def distributed(**options):
    build = ours(lambda model, local: rr.DistributedOptimizer(local, named_parameters=model.named_parameters(),
                                                              **options))
    build.leaves_in_flight = options.get("staleness", 0) == 1  # its last step's average, after a round
    return build


def ddp(hook_rank=None):
    def build(model):
        model = DistributedDataParallel(model)
        if hook_rank is not None:
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=hook_rank,
                                                start_powerSGD_iter=2)
            model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return model, torch.optim.SGD(model.parameters(), lr=0.01)
    return build


VARIANTS = {
    "local steps only (no communication)": ours(lambda model, local: local),
    "synchronous": distributed(),
    "fp16": distributed(compression=rr.Compression.fp16),
    "bf16": distributed(compression=rr.Compression.bf16),
    "PowerSGD rank 1": distributed(compression=rr.PowerSGD(matrix_approximation_rank=1, start_powerSGD_iter=2)),
    "PowerSGD rank 4": distributed(compression=rr.PowerSGD(matrix_approximation_rank=4, start_powerSGD_iter=2)),
    "top-k 1 % with error feedback": distributed(compression=rr.Compression.error_feedback(rr.Compression.topk(0.01))),
    "top-k 1 % with DGC's momentum correction": distributed(compression=rr.Compression.dgc(0.01)),
    "local SGD H=4": ours(lambda model, local: rr.PostLocalSGDOptimizer(local, rr.PeriodicModelAverager(period=4))),
    "local SGD H=4, changes as bf16": ours(lambda model, local: rr.PostLocalSGDOptimizer(
        local, rr.PeriodicModelAverager(period=4, compression=rr.Compression.bf16))),
    "stale averaging": distributed(staleness=1),
    "stale averaging without weight prediction": distributed(staleness=1, weight_prediction=False),
    "DDP on gloo": ddp(),
    "DDP on gloo, PowerSGD hook rank 4": ddp(hook_rank=4),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--steps-per-round", type=int, default=8, help="a multiple of 4 (local SGD's period)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--link", default=None, help="what joins the hosts, for the report (e.g. '1 Gbit/s')")
    args = parser.parse_args()
    rr.init()
    start_gloo(rr.rank(), rr.size())
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data, target = torch.randn(args.batch_size, 3, 32, 32), torch.randint(0, 10, (args.batch_size,))
    torch.manual_seed(1)
    model = mlp()
    steppers = {name: stepper(*build(copy.deepcopy(model)), data, target, getattr(build, "leaves_in_flight", False))
                for name, build in VARIANTS.items()}
    seconds = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            rr.barrier()
            start = time.perf_counter()
            for _ in range(args.steps_per_round):
                steppers[name]()
            seconds[name].append((time.perf_counter() - start) / args.steps_per_round)
    wire = {}  # untimed: one round each, with nothing in flight before or after it
    for name, step in steppers.items():
        step.finish()
        before = rr.engine_stats()["bytes"]
        for _ in range(args.steps_per_round):
            step()
        step.finish()
        wire[name] = (rr.engine_stats()["bytes"] - before) / args.steps_per_round
    slowest = {name: rr.allreduce(torch.tensor([statistics.median(s)], dtype=torch.float64), op=rr.Max,
                                  name=f"seconds.{name}").item() for name, s in seconds.items()}
    hosts = len(set(rr.allgather_object(os.uname().nodename)))
    if rr.rank() == 0:
        report(slowest, wire, hosts, args)


def stepper(model, optimizer, data, target, leaves_in_flight):
    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
    for _ in range(4):  # warm-up, past PowerSGD's plain steps
        step()
    step.finish = optimizer.synchronize if leaves_in_flight else lambda: None  # waits for what is in flight
    return step


def report(seconds, wire, hosts, args):
    where = f"{rr.size()} ranks on {hosts} host(s)" + (
        f", linked at {args.link}" if args.link else "")
    print(f"Communication-efficient training: the MLP (3.2 M parameters), batch {args.batch_size} per rank, {where}")
    print(f"{'variant':42s} {'ms/step':>8s} {'x sync':>7s} {'efficiency':>10s} {'MB/step':>9s}")
    local, synchronous = seconds["local steps only (no communication)"], seconds["synchronous"]
    for name, value in seconds.items():
        megabytes = "" if name.startswith("DDP") else f"{wire[name] / 1e6:9.3f}"
        print(f"{name:42s} {value * 1e3:8.1f} {value / synchronous:7.2f} {local / value:10.2f} {megabytes}")
    os.makedirs(RESULTS, exist_ok=True)
    suffix = "" if not args.link else "-" + args.link.replace(" ", "").replace("/", "")
    with open(os.path.join(RESULTS, f"communication{suffix}.json"), "w") as f:
        json.dump({"ranks": rr.size(), "where": where, "batch_per_rank": args.batch_size,
                   "seconds_per_step": seconds, "bytes_per_step": wire}, f, indent=2)


if __name__ == "__main__":
    main()
