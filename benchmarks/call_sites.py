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

    def record(self, message, set_id, caller=None):
        return None

    @staticmethod
    def finished(flight):
        pass

    @staticmethod
    def started_as(flight, handle):
        pass


def plain_4k(x):
    start = time.perf_counter()
    for _ in range(500):
        rr.allreduce(x, op=rr.Sum, name="bench.4k")
    return (time.perf_counter() - start) / 500


def resnet_step(grads):
    start = time.perf_counter()
    handles = [rr.allreduce_async_(g, op=rr.Average, name=f"bench.grad.{i}") for i, g in enumerate(grads)]
    for handle in handles:
        rr.synchronize(handle)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    rr.init()
    x = np.ones(1024, np.float32)
    grads = [np.ones(shape, np.float32) for shape in reversed(gradient_shapes())]
    looked_up, recorder = call_sites.user_call_site, runtime.active().flight_recorder
    variants = {"both": (looked_up, recorder), "without call sites": (lambda depth=2: "", recorder),
                "without the recorder": (looked_up, NoRecorder())}
    measure = {"plain 4 KiB": lambda: plain_4k(x), "ResNet-50 step": lambda: resnet_step(grads)}
    ratios = {(case, part): [] for case in measure for part in ("call sites", "flight recorder")}
    steps = {case: [] for case in measure}
    for _ in range(2):  # warm-up: plans, the response cache, the fusion buffer
        plain_4k(x)
        resnet_step(grads)
    names = list(variants)
    for round_ in range(args.rounds):
        for case, run in measure.items():
            times = {}
            for variant in names[round_ % 3:] + names[:round_ % 3]:
                collectives.user_call_site, runtime.active().flight_recorder = variants[variant]
                run()  # a message without a site is not the cached one: negotiated again, untimed
                rr.barrier()
                times[variant] = run()
            steps[case].append(times["both"])
            ratios[(case, "call sites")].append(times["both"] / times["without call sites"])
            ratios[(case, "flight recorder")].append(times["both"] / times["without the recorder"])
    collectives.user_call_site, runtime.active().flight_recorder = looked_up, recorder
    if rr.rank() == 0:
        print(f"call sites and flight recorder, {rr.size()} ranks: median of {args.rounds} rounds' ratios, "
              "each round's variants back to back")
        for case in measure:
            sites, flights = (100 * (statistics.median(ratios[(case, part)]) - 1)
                              for part in ("call sites", "flight recorder"))
            print(f"  {case:15s} {statistics.median(steps[case]) * 1e3:8.3f} ms; call sites {sites:+5.1f} %, "
                  f"flight recorder {flights:+5.1f} %")
    rr.shutdown()


if __name__ == "__main__":
    main()
