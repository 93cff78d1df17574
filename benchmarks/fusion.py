"""Fusion benchmark: ResNet-50's gradients allreduced the way a backward pass submits them.

    rrun -np 2 python benchmarks/fusion.py [--steps N]

In the same run: one MPI Allreduce of the gradients concatenated into one buffer (timed
before ringreduce starts, because an engine thread polling MPI slows down the MPI library's
own calls on the main thread), then, interleaved step after step in a rotating order, each
timed step after an untimed one of the same variant: the engine with fusion (async, submitted
in backward order), one synchronous allreduce per tensor, and the engine with fp16 and with
bf16 compression, and the casts alone against a copy. Prints a table (rank 0) and writes
benchmarks/results/fusion.json. Every variant is checked against the expected sum before it is
timed.
"""

import argparse
import json
import os
import platform
import statistics
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI
from resnet50 import gradient_shapes

import ringreduce as rr

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    shapes = list(reversed(gradient_shapes()))  # the order backward produces them
    grads = [np.full(shape, rank + 1, dtype=np.float32) for shape in shapes]
    flat = np.concatenate([g.reshape(-1) for g in grads])
    expected = size * (size + 1) / 2

    def mpi_concatenated():
        out = np.empty_like(flat)
        world.Allreduce(flat, out, op=MPI.SUM)
        return [out]

    baseline = "MPI Allreduce of the concatenated buffer"
    times = {baseline: timed(mpi_concatenated, expected, args.steps, world.Barrier)}
    rr.init()

    # The same gradients as views of one buffer: the engine's work is the same, the memory is
    # the concatenated buffer's (161 separate arrays read slower on this VM, also in one pass).
    views = np.split(flat.copy(), np.cumsum([g.size for g in grads])[:-1])
    views = [v.reshape(g.shape) for v, g in zip(views, grads, strict=True)]

    def fused(compression=rr.Compression.none, tensors=grads):
        handles = [rr.allreduce_async(g, op=rr.Sum, name=f"grad.{i}", compression=compression)
                   for i, g in enumerate(tensors)]
        return [rr.synchronize(h) for h in handles]

    def one_at_a_time():
        return [rr.allreduce(g, op=rr.Sum, name=f"grad.{i}") for i, g in enumerate(grads)]

    variants = {
        "ringreduce allreduce of the concatenated buffer": lambda: [rr.allreduce(flat, op=rr.Sum, name="flat")],
        "ringreduce fused (async, backward order)": fused,
        "ringreduce fused, gradients are views of one buffer": lambda: fused(tensors=views),
        "ringreduce one synchronous allreduce per tensor": one_at_a_time,
        "ringreduce fused, fp16 compression": lambda: fused(rr.Compression.fp16),
        "ringreduce fused, bf16 compression": lambda: fused(rr.Compression.bf16),
    }
    for name, run in variants.items():  # check, and warm up
        for result in run():
            assert np.all(result == expected), f"{name} gave a wrong sum"
    times.update({name: [] for name in variants})
    collectives = {baseline: 1}
    names = list(variants)
    for step in range(args.steps):
        # A training loop repeats one way of allreducing, so each timed step follows an untimed
        # one of the same variant: what the variant before left behind (the recycled result
        # blocks, the caches) made the next one up to 2x slower. The order rotates too.
        for name in names[step % len(names):] + names[:step % len(names)]:
            run = variants[name]
            run()
            rr.barrier()
            before = rr.engine_stats()["collectives"]
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
            collectives[name] = rr.engine_stats()["collectives"] - before
    casts = cast_throughput(flat)
    if rank == 0:
        report(times, collectives, casts, size, len(shapes), flat.size, args.steps, baseline)


def timed(run, expected, steps, barrier):
    """Check `run` once, then the time of each of `steps` runs."""
    for result in run():
        assert np.all(result == expected), "the baseline gave a wrong sum"
    times = []
    for _ in range(steps):
        barrier()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def cast_throughput(flat):
    """Values per second of each wire dtype's casts on these gradients (numpy's float16,
    ml_dtypes' bfloat16), and of a plain float32 copy: the price of compression."""
    rates = {}
    for name, dtype in (("float32", np.float32), ("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)):
        wire, back = np.zeros(flat.size, dtype=dtype), np.zeros_like(flat)  # touched: no page faults timed
        start = time.perf_counter()
        np.copyto(wire, flat, casting="unsafe")
        middle = time.perf_counter()
        np.copyto(back, wire, casting="unsafe")
        end = time.perf_counter()
        rates[f"float32_to_{name}_per_second"] = flat.size / (middle - start)
        rates[f"{name}_to_float32_per_second"] = flat.size / (end - middle)
    return rates


def report(times, collectives, casts, size, tensors, parameters, steps, baseline_name):
    medians = {name: statistics.median(values) for name, values in times.items()}
    baseline = medians[baseline_name]
    print(f"Fusion benchmark: ResNet-50 gradients ({tensors} tensors, {parameters:,} float32 parameters, "
          f"{parameters * 4 / 2**20:.0f} MiB), {size} ranks, median of {steps} steps")
    print(f"{'variant':52s} {'ms/step':>9s} {'vs MPI':>7s} {'collectives':>11s}")
    for name, median in medians.items():
        print(f"{name:52s} {median * 1e3:9.1f} {median / baseline:6.2f}x {collectives[name]:11d}")
    print("casts (M values/s, there and back): " + ", ".join(
        f"{name} {casts[f'float32_to_{name}_per_second'] / 1e6:.0f} and "
        f"{casts[f'{name}_to_float32_per_second'] / 1e6:.0f}" for name in ("float32", "float16", "bfloat16")))
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "fusion.json"), "w") as f:
        json.dump({"ranks": size, "tensors": tensors, "parameters": parameters, "steps": steps,
                   "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
                   "median_seconds": medians, "collectives_per_step": collectives, "casts": casts}, f, indent=2)


if __name__ == "__main__":
    main()
