"""The small synchronous collective on a process set, as a tensor-parallel forward pass calls it,
against MPI's own Allreduce on a communicator of the same ranks, in the same run and interleaved;
named and unnamed calls; and a step of the hybrid-parallel pattern (a column- then a
row-parallel layer on a set, forward and backward).

    rrun -np 3 python benchmarks/process_sets.py [--seconds-per-point 0.5]

The set is ranks 0 and 1; any other rank waits. Every result is checked before it is timed.
Writes a table and benchmarks/results/process_sets.json.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import numpy as np
import torch
from mpi4py import MPI

import ringreduce as core
import ringreduce.torch as rr

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SIZES = (4 << 10, 64 << 10)


def timed(call, count):
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-point", type=float, default=0.5)
    args = parser.parse_args()
    rr.init()
    pair = rr.add_process_set([0, 1])
    mpi_pair = MPI.COMM_WORLD.Split(0 if pair.included() else MPI.UNDEFINED, rr.rank())
    rows = []
    if pair.included():
        for size in SIZES:
            x = np.full(size // 4, rr.rank() + 1.0, dtype=np.float32)
            out = np.empty_like(x)
            calls = {
                "named": lambda x=x: core.allreduce(x, op=core.Sum, name="tp", process_set=pair),
                "unnamed": lambda x=x: core.allreduce(x, op=core.Sum, process_set=pair),
                "MPI": lambda x=x, out=out: mpi_pair.Allreduce(x, out) or out,
            }
            for name, call in calls.items():
                assert np.all(call() == 3.0), name
            # The same number of calls on both ranks: the first rank decides it from a pilot of MPI's.
            pilot = timed(calls["MPI"], 200)
            count = mpi_pair.bcast(int(args.seconds_per_point / 3 / pilot))
            medians = {name: [] for name in calls}
            for round_ in range(4):  # interleaved rounds, the first one a warm-up
                for name, call in calls.items():
                    median = timed(call, max(count, 50))
                    if round_:
                        medians[name].append(median)
            row = {"bytes": size, **{name: statistics.median(v) for name, v in medians.items()}}
            rows.append(row)
        step = hybrid_step(pair)
        step_seconds = timed(step, 30)
    rr.barrier()
    if rr.rank() == 0:
        report(rows, step_seconds)


def hybrid_step(pair):
    """Forward and backward of Linear(256, 1024) -> ReLU -> Linear(1024, 256), split over the set
    (a ColumnParallelLinear with its output split, then a RowParallelLinear), batch 32."""
    torch.manual_seed(0)
    whole = [torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)]
    model = torch.nn.Sequential(rr.ColumnParallelLinear.from_linear(whole[0], pair, gather_output=False),
                                torch.nn.ReLU(), rr.RowParallelLinear.from_linear(whole[1], pair))
    x = torch.randn(32, 256)

    def step():
        model.zero_grad()
        model(x).square().mean().backward()

    for _ in range(5):
        step()
    return step


def report(rows, step_seconds):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print("allreduce on a set of 2 ranks | named | unnamed | MPI Allreduce | named vs MPI | unnamed vs MPI")
    for row in rows:
        print(f"{row['bytes'] >> 10} KiB | {row['named'] * 1e6:.0f} us | {row['unnamed'] * 1e6:.0f} us | "
              f"{row['MPI'] * 1e6:.0f} us | {row['named'] / row['MPI']:.1f}x | {row['unnamed'] / row['MPI']:.1f}x")
    print(f"hybrid step (column- then row-parallel layer, forward and backward): {step_seconds * 1e3:.2f} ms")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "process_sets.json"), "w") as f:
        json.dump({"commit": commit, "date": time.strftime("%Y-%m-%d"), "ranks": MPI.COMM_WORLD.size,
                   "machine": platform.machine(), "rows": rows, "hybrid_step_seconds": step_seconds}, f, indent=1)


if __name__ == "__main__":
    main()
