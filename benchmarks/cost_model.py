"""The cost model against measurement, without circularity: a profile fitted by the short probe
(`rrun -np 2 --calibrate PATH`, run before this) predicts held-out cases that the probe never ran:
every family's allreduce at 64 KiB to 256 MiB, at this job's number of ranks and hosts.

    rrun -np 2 --calibrate /tmp/profile.json
    rrun -np 3 python benchmarks/cost_model.py --profile /tmp/profile.json --label "one host"

Prints, and appends to benchmarks/results/cost_model.jsonl, each case's median of measured
seconds against the prediction. Below 64 KiB it reports the spread between runs instead.
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import time

import numpy as np
from mpi4py import MPI

from ringreduce.algorithms import cost
from ringreduce.algorithms.families import HalvingDoublingFamily, RingFamily, TreeFamily
from ringreduce.algorithms.mpi_native import MPIAlgorithms
from ringreduce.algorithms.shared import SharedMemory
from ringreduce.machine import topology
from ringreduce.machine.shared_memory import Segment
from ringreduce.machine.transport import MPITransport
from ringreduce.ops import ReduceOp

SIZES = [1 << 10, 8 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "cost_model.jsonl"


def families(comm, place, host_comm, cross_comm):
    transport = MPITransport(comm)
    built = {"mpi": MPIAlgorithms(transport), "ring": RingFamily(transport, 4 << 20),
             "halving_doubling": HalvingDoublingFamily(transport, 4 << 20), "tree": TreeFamily(transport, 4 << 20)}
    if place.local_size > 1:
        segment = Segment(host_comm, place.local_size << 20)
        if place.hosts == 1:
            built["shm"] = SharedMemory(segment)
        elif place.homogeneous:
            built["hierarchical"] = SharedMemory(segment, RingFamily(MPITransport(cross_comm), 4 << 20).allreduce)
    return built


def seconds(comm, family, nbytes, budget):
    """Median over repetitions (each started together) of the slowest rank's time."""
    buf = np.ones(nbytes // 4, np.float32)
    reps = int(max(3, min(30, budget / max(1e-5, _one(comm, family, buf)))))
    samples = [_one(comm, family, buf) for _ in range(reps)]
    return statistics.median(samples), min(samples), max(samples)


def _one(comm, family, buf):
    comm.Barrier()  # MPI's own: it spins, so every rank leaves it within microseconds
    start = time.perf_counter()
    family.allreduce(buf, ReduceOp.SUM)
    return comm.allreduce(time.perf_counter() - start, op=MPI.MAX)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", required=True)
    parser.add_argument("--label", default="")
    parser.add_argument("--max-bytes", type=int, default=256 << 20)
    parser.add_argument("--budget", type=float, default=0.5, help="seconds per case, about")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    place, host_comm, cross_comm = topology.discover(comm)
    profile = cost.load(args.profile)
    model = cost.Model(profile, cost.Shape(place.size, place.hosts, place.homogeneous))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    for name, family in families(comm, place, host_comm, cross_comm).items():
        for nbytes in [n for n in SIZES if n <= args.max_bytes]:
            if name == "tree" and nbytes > 16 << 20:
                continue  # whole arrays at every level: far off the chart and minutes long
            median, low, high = seconds(comm, family, nbytes, args.budget)
            predicted = model.allreduce(name, nbytes)
            rows.append({"label": args.label, "commit": commit, "date": time.strftime("%Y-%m-%d"),
                         "ranks": place.size, "hosts": place.hosts, "family": name, "bytes": nbytes,
                         "median": median, "min": low, "max": high, "predicted": predicted})
            if comm.rank == 0:
                print(f"{name:17s} {nbytes:>10d} B  measured {median * 1e3:9.3f} ms "
                      f"(min {low * 1e3:.3f}, max {high * 1e3:.3f})  predicted {predicted * 1e3:9.3f} ms  "
                      f"ratio {predicted / median:5.2f}", flush=True)
    if comm.rank == 0:
        with RESULTS.open("a") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
