"""What RINGREDUCE_DETERMINISTIC costs: each family's float32 allreduce against the rank-order
family that takes its float sums under the switch, from 4 KiB to 64 MiB, in the same run (in
rotating order, each the slowest rank's median; the tree stops at 16 MiB, as the cost model's).
A family that adds in rank order already (shared memory on one host) is kept: "kept".

    rrun -np 3 python benchmarks/deterministic.py
"""

import argparse

from cost_model import families, seconds
from mpi4py import MPI

from ringreduce.algorithms.rank_order import RankOrderFamily
from ringreduce.machine import topology
from ringreduce.machine.transport import MPITransport

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.1, help="seconds per case and round, about")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    place, host_comm, cross_comm = topology.discover(comm)
    built = {**families(comm, place, host_comm, cross_comm), "rank order": RankOrderFamily(MPITransport(comm))}
    cases = [(name, n) for n in SIZES for name in built if not (name == "tree" and n > 16 << 20)]
    times = {case: [] for case in cases}
    for round_ in range(args.rounds):
        shift = round_ % len(cases)
        for case in cases[shift:] + cases[:shift]:
            times[case].append(seconds(comm, built[case[0]], case[1], args.budget))
    if comm.rank == 0:
        names = [name for name in built if name != "rank order"]
        print(f"RINGREDUCE_DETERMINISTIC's cost, {comm.size} ranks on {place.hosts} host(s): float32 allreduce, "
              "ms (median of rounds); x: the rank-order family's time over the family's")
        print(f"{'size':>9s} {'rank order':>11s} " + " ".join(f"{name:>22s}" for name in names))
        for nbytes in SIZES:
            ordered = sorted(times[("rank order", nbytes)])[len(times[("rank order", nbytes)]) // 2]
            cells = []
            for name in names:
                if (name, nbytes) not in times:
                    cells.append(f"{'-':>22s}")
                    continue
                own = sorted(times[(name, nbytes)])[len(times[(name, nbytes)]) // 2]
                ratio = "    kept" if built[name].adds_in_rank_order else f"{ordered / own:8.2f}"
                cells.append(f"{own * 1e3:12.3f} x{ratio}")
            size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
            print(f"{size:>9s} {ordered * 1e3:11.3f} " + " ".join(cells))


if __name__ == "__main__":
    main()
