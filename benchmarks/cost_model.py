"""The cost model against measurement, without circularity: the short probe (planning/calibration.py) on
two ranks predicts held-out cases it never ran: every family's allreduce (or `--collective`: its
broadcast, allgather or reducescatter) at 1 KiB to 256 MiB, at this job's number of ranks and
hosts. Each case also records what the same profile predicts without its fresh-data term
(cost.Link.fresh) and without its shared-memory handover (cost.Profile.shm_handover), to show what
each term does in the same rounds.

    rrun -np 3 python benchmarks/cost_model.py --label "one host"
    rrun -np 4 python benchmarks/cost_model.py --probe-on-all --label "one host, probed on 4"
    rrun -np 2 python benchmarks/cost_model.py --collective broadcast --label "one host"
    rrun -H a:2,b:2 python benchmarks/cost_model.py --profile cluster.json   # probed before, across hosts

These machines are shared and their speed drifts by 2x within minutes, so the probe and the cases
run in rounds, each round probing again (on ranks 0 and 1, the others waiting) and then running
every case a few times: a case's measured median and its predicted median come from the same
rounds. Appends each case to benchmarks/results/cost_model.jsonl.
"""

import argparse
import dataclasses
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
from ringreduce.algorithms.shared_memory import SharedMemory
from ringreduce.machine import topology
from ringreduce.machine.layout import even_counts, offsets_of
from ringreduce.machine.segment import Segment
from ringreduce.machine.transport import MPITransport, wait_all
from ringreduce.ops import ReduceOp
from ringreduce.planning import calibration, profiles

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


def call(collective, family, nbytes, size):
    """One `collective` of `nbytes` (the whole result) with `family`, as a function of no arguments."""
    buf = np.zeros(nbytes // 4, np.float32)  # summed again and again: ones would overflow
    offsets = offsets_of(even_counts(len(buf), size))
    return {"allreduce": lambda: family.allreduce(buf, ReduceOp.SUM),
            "reducescatter": lambda: family.reducescatter(buf, offsets, ReduceOp.SUM),
            "allgather": lambda: family.allgather(buf, offsets),
            "broadcast": lambda: family.broadcast(buf, 0)}[collective]


def seconds(comm, run, budget):
    """Median over repetitions (each started together) of the slowest rank's time."""
    reps = int(max(3, min(30, budget / max(1e-5, _one(comm, run)))))
    return statistics.median(_one(comm, run) for _ in range(reps))


def _one(comm, run):
    comm.Barrier()  # MPI's own: it spins, so every rank leaves it within microseconds
    start = time.perf_counter()
    run()
    elapsed = time.perf_counter() - start
    # A rank done early waits as a job's would, asleep: spinning in MPI's allreduce, it would take
    # a core from the ranks still at work (3 ranks on 2 cores: the unfold of halving and doubling).
    wait_all([comm.Ibarrier()])
    return comm.allreduce(elapsed, op=MPI.MAX)


def probe_on_two(comm):
    """The probe on ranks 0 and 1 (what `rrun -np 2 --calibrate` measures), the others waiting."""
    pair = comm.Split(0 if comm.rank < 2 else MPI.UNDEFINED, comm.rank)
    profile = calibration.measure(pair)[0] if pair != MPI.COMM_NULL else None
    wait_all([comm.Ibarrier()])
    return comm.bcast(profile, root=0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    parser.add_argument("--collective", default="allreduce", choices=cost.COLLECTIVES)
    parser.add_argument("--max-bytes", type=int, default=256 << 20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.15, help="seconds per case and round, about")
    parser.add_argument("--profile", help="a profile from rrun --calibrate, instead of probing every round")
    parser.add_argument("--probe-on-all", action="store_true",
                        help="probe on every rank of the job (what `rrun -np N --calibrate` measures), not on two")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    place, host_comm, cross_comm = topology.discover(comm)
    shape = cost.JobShape(place.size, place.hosts, place.homogeneous)
    built = families(comm, place, host_comm, cross_comm)
    candidates = cost.Model(cost.DEFAULT, shape).candidates(args.collective)
    built = {name: family for name, family in built.items() if name in candidates}
    cases = [(name, n) for name in built for n in SIZES
             if n <= args.max_bytes and not (name == "tree" and n > 16 << 20)]
    measured, predicted = ({case: [] for case in cases} for _ in range(2))
    alternatives = {key: {case: [] for case in cases} for key in ("without_fresh", "without_handover")}
    for _ in range(args.rounds):
        profile = (profiles.load(args.profile) if args.profile
                   else calibration.measure(comm)[0] if args.probe_on_all else probe_on_two(comm))
        model = cost.Model(profile, shape)
        without = {"without_fresh": dataclasses.replace(profile, host=dataclasses.replace(profile.host, fresh=None)),
                   "without_handover": dataclasses.replace(profile, shm_handover=0.0)}
        without = {key: cost.Model(other, shape) for key, other in without.items()}
        for name, nbytes in cases:
            run = call(args.collective, built[name], nbytes, place.size)
            measured[name, nbytes].append(seconds(comm, run, args.budget))
            predicted[name, nbytes].append(model.cost(args.collective, name, nbytes))
            for key, other in without.items():
                alternatives[key][name, nbytes].append(other.cost(args.collective, name, nbytes))
    if comm.rank == 0:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=pathlib.Path(__file__).parent).stdout.strip()
        with RESULTS.open("a") as out:
            for name, nbytes in cases:
                row = {"label": args.label, "commit": commit, "date": time.strftime("%Y-%m-%d"),
                       "collective": args.collective, "ranks": place.size,
                       "hosts": place.hosts, "family": name, "bytes": nbytes,
                       "median": statistics.median(measured[name, nbytes]),
                       "min": min(measured[name, nbytes]), "max": max(measured[name, nbytes]),
                       "predicted": statistics.median(predicted[name, nbytes]),
                       **{key: statistics.median(values[name, nbytes]) for key, values in alternatives.items()}}
                out.write(json.dumps(row) + "\n")
                print(f"{args.collective:13s} {name:17s} {nbytes:>10d} B  measured {row['median'] * 1e3:9.3f} ms "
                      f"(rounds {row['min'] * 1e3:.3f}-{row['max'] * 1e3:.3f})  "
                      f"predicted {row['predicted'] * 1e3:9.3f} ms  "
                      f"ratio {row['predicted'] / row['median']:5.2f}", flush=True)


if __name__ == "__main__":
    main()
