"""fp16 and bf16 on the wire with numpy's kernels against the torch kernels ringreduce.torch lends
the core (ringreduce/numerics/kernels.py), in one sitting: each kernel's rate on one core (G values/s, with
a float32 copy of the same array as the yardstick), then allreduces of the training benchmark's
gradient size (3.2 M float32 values) uncompressed, as fp16 and as bf16, each with numpy's kernels
and with torch's, in alternating rounds.

    rrun -np 2 python benchmarks/narrow_floats.py

Rank 0 prints the tables and writes benchmarks/results/narrow_floats.json.
"""

import json
import os
import statistics
import time

import numpy as np
import torch

import ringreduce as core
import ringreduce.torch  # noqa: F401 - lends its kernels
from ringreduce import ops
from ringreduce.numerics import kernels, reduction
from ringreduce.numerics.compression import bfloat16
from ringreduce.torch.kernels import TorchKernels

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
VALUES = 3_211_264 + 1_098  # the training benchmark's MLP: its weights and biases
LENDERS = {"numpy": None, "torch": TorchKernels()}


def best_rate(work, count, repeats=7):
    """G values/s of the fastest of `repeats` runs of work()."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return count / best / 1e9


def kernel_rates():
    """{kernel: {lender: G values/s}} on arrays of 16 M values."""
    count = 16 << 20
    single = np.random.default_rng(0).standard_normal(count).astype(np.float32)
    copy = np.empty_like(single)
    narrow = {name: single.astype(dtype) for name, dtype in (("float16", np.float16), ("bfloat16", bfloat16()))}
    rates = {"float32 copy": {"numpy": best_rate(lambda: np.copyto(copy, single), count)}}
    for lender, lent in LENDERS.items():
        kernels.lend(lent)
        for name, wire in narrow.items():
            target, add = np.empty_like(wire), reduction.ufunc(ops.Sum, wire.dtype)
            work = {f"float32 to {name}": lambda t=target: kernels.cast_into(t, single),
                    f"{name} to float32": lambda w=wire: kernels.cast_into(copy, w),
                    f"{name} sum": lambda t=target, w=wire, add=add: add(t, w, out=t)}
            for kernel, run in work.items():
                rates.setdefault(kernel, {})[lender] = best_rate(run, count)
    return rates


def allreduce_times(rounds=7, calls=5):
    """{variant: median ms per allreduce} of VALUES float32 values, in rounds that alternate."""
    gradient = np.random.default_rng(core.rank()).standard_normal(VALUES).astype(np.float32)
    variants = {"uncompressed": ("numpy", core.Compression.none)}  # no narrow floats: either lender
    for lender in LENDERS:
        for name in ("fp16", "bf16"):
            variants[f"{name}, {lender}'s kernels"] = (lender, getattr(core.Compression, name))
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (lender, compression) in variants.items():
            kernels.lend(LENDERS[lender])
            core.allreduce(gradient, compression=compression, name=name)  # warm
            core.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                core.allreduce(gradient, compression=compression, name=name)
            times[name].append((time.perf_counter() - start) / calls * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def main():
    core.init()
    torch.set_num_threads(1)
    rates = kernel_rates() if core.rank() == 0 else None
    times = allreduce_times()
    if core.rank() != 0:
        return
    print("| kernel (one core) | numpy, G values/s | torch, G values/s | torch / numpy |")
    print("|---|---|---|---|")
    for kernel, by in rates.items():
        torch_rate = by.get("torch")
        extra = f"{torch_rate:.2f} | {torch_rate / by['numpy']:.1f}x" if torch_rate else "| "
        print(f"| {kernel} | {by['numpy']:.2f} | {extra} |")
    print(f"\n| allreduce of {VALUES:,} float32 on {core.size()} ranks | ms | x uncompressed |")
    print("|---|---|---|")
    for name, ms in times.items():
        print(f"| {name} | {ms:.1f} | {ms / times['uncompressed']:.2f} |")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "narrow_floats.json"), "w") as f:
        json.dump({"ranks": core.size(), "kernel_rates": rates, "allreduce_ms": times}, f, indent=1)


if __name__ == "__main__":
    main()
