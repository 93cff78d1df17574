"""What naming call sites and the flight recorder cost: every collective records where the user's
code called it (engine/call_sites.py, file:line of the first frame outside ringreduce and the
frameworks), so that errors and reports can say where each rank waits, and goes into the flight
recorder (engine/flight_recorder.py). Same run, rotating order: the plain 4 KiB allreduce and a
step of ResNet-50's 161 gradients (async, fused, as a backward pass submits them), each with both,
without call sites (the lookup replaced by one that returns nothing) and without the recorder (one
that keeps nothing and reads no clock).

    rrun -np 2 python benchmarks/call_sites.py
"""

import argparse
import statistics
import time

import numpy as np
from resnet50 import gradient_shapes

import ringreduce as rr
from ringreduce import collectives, runtime
from ringreduce.engine import call_sites


class NoRecorder:
    """A recorder that records nothing, at no cost: the baseline."""

    class _Nothing:
        handle = None

    def record(self, message, set_id, handle=None, site=None):
        return self._Nothing()

    @staticmethod
    def finished(flight):
        pass


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
    looked_up, recorder = call_sites.user_call_site, runtime.active().flight_recorder
    variants = {"both": (looked_up, recorder), "without call sites": (lambda depth=2: "", recorder),
                "without the recorder": (looked_up, NoRecorder())}
    cases = [(case, variant) for case in ("plain 4 KiB", "ResNet-50 step") for variant in variants]
    times = {case: [] for case in cases}
    for _ in range(2):  # warm-up: plans, the response cache, the fusion buffer
        plain_4k(x)
        resnet_step(grads)
    for round_ in range(args.rounds):
        shift = round_ % len(cases)
        for case, variant in cases[shift:] + cases[:shift]:
            collectives.user_call_site, runtime.active().flight_recorder = variants[variant]
            rr.barrier()
            times[(case, variant)].append(plain_4k(x) if case == "plain 4 KiB" else resnet_step(grads))
    collectives.user_call_site, runtime.active().flight_recorder = looked_up, recorder
    if rr.rank() == 0:
        print(f"call sites and flight recorder, {rr.size()} ranks: median of {args.rounds} rounds, same run")
        for case in ("plain 4 KiB", "ResNet-50 step"):
            both, no_sites, no_recorder = (statistics.median(times[(case, v)]) for v in variants)
            print(f"  {case:15s} {both * 1e3:8.3f} ms; call sites {100 * (both / no_sites - 1):+5.1f} %, "
                  f"flight recorder {100 * (both / no_recorder - 1):+5.1f} %")
    rr.shutdown()


if __name__ == "__main__":
    main()
