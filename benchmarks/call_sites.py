"""What naming call sites costs: every collective records where the user's code called it
(engine/call_sites.py, file:line of the first frame outside ringreduce and the frameworks), so
that errors and reports can say where each rank waits. Same run, rotating order: the plain 4 KiB
allreduce and a step of ResNet-50's 161 gradients (async, fused, as a backward pass submits
them), each with call sites and with them off (the lookup replaced by one that returns nothing).

    rrun -np 2 python benchmarks/call_sites.py
"""

import argparse
import statistics
import time

import numpy as np
from resnet50 import gradient_shapes

import ringreduce as rr
from ringreduce import collectives
from ringreduce.engine import call_sites


def plain_4k(x):
    start = time.perf_counter()
    for _ in range(50):
        rr.allreduce(x, op=rr.Sum, name="bench.4k")
    return (time.perf_counter() - start) / 50


def resnet_step(grads):
    start = time.perf_counter()
    handles = [rr.allreduce_async_(g, op=rr.Average, name=f"bench.grad.{i}") for i, g in enumerate(grads)]
    for handle in handles:
        rr.synchronize(handle)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    rr.init()
    x = np.ones(1024, np.float32)
    grads = [np.ones(shape, np.float32) for shape in reversed(gradient_shapes())]
    looked_up = call_sites.user_call_site
    variants = {"with call sites": looked_up, "without": lambda depth=2: ""}
    cases = [(case, variant) for case in ("plain 4 KiB", "ResNet-50 step") for variant in variants]
    times = {case: [] for case in cases}
    for _ in range(2):  # warm-up: plans, the response cache, the fusion buffer
        plain_4k(x)
        resnet_step(grads)
    for round_ in range(args.rounds):
        shift = round_ % len(cases)
        for case, variant in cases[shift:] + cases[:shift]:
            collectives.user_call_site = variants[variant]
            rr.barrier()
            times[(case, variant)].append(plain_4k(x) if case == "plain 4 KiB" else resnet_step(grads))
    collectives.user_call_site = looked_up
    if rr.rank() == 0:
        print(f"call sites, {rr.size()} ranks: median of {args.rounds} rounds, same run")
        for case in ("plain 4 KiB", "ResNet-50 step"):
            on, off = (statistics.median(times[(case, v)]) for v in variants)
            print(f"  {case:15s} with {on * 1e3:8.3f} ms, without {off * 1e3:8.3f} ms: {100 * (on / off - 1):+5.1f} %")
    rr.shutdown()


if __name__ == "__main__":
    main()
