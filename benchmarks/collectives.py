"""The collective benchmark: ringreduce against MPI's own collectives and torch.distributed's
gloo, in the same run (gloo in rounds of its own, the others interleaved), with the floor a ring
cannot go below.

    rrun -np 2 python benchmarks/collectives.py [--max-mib 256] [--seconds-per-point 1.0]

For allreduce, allgather, broadcast and reducescatter of float32 arrays from 4 KiB up, each
implementation's result is checked against the expected values, then timed (median of
repeated iterations after a warm-up): ringreduce's API (the engine, with the algorithm that
RINGREDUCE_ALGORITHM=auto picks), each of ringreduce's algorithm families called directly
(the cost of the algorithm without the engine), MPI's own collective and gloo. Reports time,
algorithm bandwidth and bus bandwidth in the nccl-tests convention (busbw = algbw * 2(n-1)/n
for allreduce, (n-1)/n for allgather and reducescatter, 1 for broadcast), and for allreduce
the floor: the point-to-point transfers and the reductions a ring must do at that size,
timed with bare mpi4py calls on buffers allocated once. Then the CPU a rank burns while it
waits 2 s for a late peer inside an allreduce (ringreduce, and MPI's blocking Allreduce), and
while its engine idles. Writes a table, benchmarks/results/collectives.json and
benchmarks/results/collectives.png.
"""

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
from gloo import start_gloo
from mpi4py import MPI

import ringreduce as rr
from ringreduce.algorithms.families import RingFamily
from ringreduce.algorithms.shared_memory import SharedMemory
from ringreduce.config import Config
from ringreduce.machine import topology
from ringreduce.machine.segment import Segment
from ringreduce.machine.transport import MPITransport

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
              "reducescatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mib", type=float, default=256)
    parser.add_argument("--seconds-per-point", type=float, default=0.5)
    parser.add_argument("--collectives", default="allreduce,allgather,broadcast,reducescatter",
                        help="comma-separated subset to run")
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from the saved JSON")
    args = parser.parse_args()
    if args.plot_only:
        with open(os.path.join(RESULTS, "collectives.json")) as f:
            saved = json.load(f)
        plot(saved["rows"], saved["ranks"], saved["machine"])
        return
    rr.init()
    rank, size = rr.rank(), rr.size()
    world = MPI.COMM_WORLD
    start_gloo(rank, size)
    families = algorithm_families(world.Dup())
    sizes = [4096 * 4**i for i in range(12) if 4096 * 4**i <= args.max_mib * 2**20]
    rows = []
    for collective in args.collectives.split(","):
        for nbytes in sizes:
            count = nbytes // 4
            implementations = candidates(collective, count, rank, size, world, families)
            times = {name: [] for name in implementations}
            for run, check in implementations.values():
                check(run())  # correct before it is timed
                run()  # warm-up
            # gloo's threads keep a core busy for a while after each of its calls, which slowed every
            # library timed among them (1 MiB allreduces with gloo's among them against without:
            # ringreduce 2.2x, its shared-memory family 1.8x, MPI 1.5x): gloo goes in rounds of its own.
            quiet = [name for name in implementations if name != "gloo"]
            for names in (quiet, [name for name in implementations if name not in quiet]):
                if names:
                    time_in_rounds({name: implementations[name][0] for name in names}, times, world,
                                   args.seconds_per_point * len(names))
            for name, values in times.items():
                seconds = statistics.median(values)
                algbw = nbytes / seconds / 1e9
                rows.append({"collective": collective, "bytes": nbytes, "implementation": name,
                             "seconds": seconds, "algbw_GBps": algbw,
                             "busbw_GBps": algbw * BUS_FACTOR[collective](size), "iterations": len(values)})
    waiting = waiting_cpu(rank, world)
    if rank == 0:
        report(rows, size, waiting)


def time_in_rounds(runs, times, world, seconds):
    """Append to times[name] the time of each call of runs[name], a barrier before each, in rounds
    of one call each until `seconds` have passed (at least 3 rounds, at most 200). Each round goes
    in a new order (the same on every rank): whatever runs right after another's call pays for
    what that call left behind, and no one always does. A rotation was not enough: it keeps each
    one's successor, and the row after gloo's looked 1.6x slower."""
    budget = time.perf_counter() + seconds
    for iteration in range(1, 201):
        for name in np.random.default_rng(iteration).permutation(list(runs)):
            world.Barrier()
            began = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - began)
        if world.bcast(iteration >= 3 and time.perf_counter() >= budget, root=0):  # rank 0's clock
            break


def algorithm_families(comm):
    """ringreduce's algorithm families, to call directly (on a communicator of their own, so they
    never meet the engine's traffic): the ring, and shared memory when every rank is on one host."""
    config = Config.from_env({})
    place, host_comm, _ = topology.discover(comm)
    families = {"ring": RingFamily(MPITransport(comm), config.pipeline_chunk_bytes)}
    if place.hosts == 1 and place.size > 1:
        families["shm"] = SharedMemory(Segment(host_comm, place.local_size * config.shared_memory_piece_bytes))
    return families


def waiting_cpu(rank, world, seconds=2.0):
    """Share of one core this process uses (all its threads) while rank 0 waits `seconds` for
    rank 1 inside an allreduce, and while its engine has nothing to do."""
    def cpu_share(run):
        world.Barrier()
        cpu, wall = time.process_time(), time.perf_counter()
        run()
        return (time.process_time() - cpu) / (time.perf_counter() - wall)

    late = (lambda run: lambda: time.sleep(seconds) or run()) if rank == 1 else (lambda run: run)
    value = np.ones(1024, dtype=np.float32)
    out = np.empty_like(value)
    return {
        "ringreduce allreduce, waiting": cpu_share(late(lambda: rr.allreduce(value, name="late"))),
        "MPI Allreduce, waiting": cpu_share(late(lambda: world.Allreduce(value, out))),
        "ringreduce engine, idle": cpu_share(lambda: time.sleep(seconds)),
    }


def candidates(collective, count, rank, size, world, families):
    """{name: (run, check)} for this collective at this size."""
    mine = np.full(count, rank + 1, dtype=np.float32)
    tensor = torch.from_numpy(mine.copy())
    total = size * (size + 1) / 2
    direct = {f"{name} algorithm, no engine": family for name, family in families.items()}

    def equals(expected):
        def check(result):
            assert np.all(np.asarray(result) == expected), f"{collective}: wrong result"
        return check

    if collective == "allreduce":
        out = np.empty_like(mine)
        work = mine.copy()
        floor = RingFloor(count, size, world)
        return {
            "ringreduce": (lambda: rr.allreduce(mine, op=rr.Sum, name="bench"), equals(total)),
            # As MPI's here: into a buffer allocated once. The first call is checked; then the
            # buffer holds zeros, which the timed calls sum again and again.
            "ringreduce in place (allreduce_)": (
                lambda: rr.allreduce_(work, op=rr.Sum, name="bench_"),
                lambda result: equals(total)(result) or work.fill(0)),
            **{name: (lambda f=family: f.allreduce(out, rr.Sum, mine) or out, equals(total))
               for name, family in direct.items()},
            "MPI Allreduce": (lambda: world.Allreduce(mine, out, op=MPI.SUM) or out, equals(total)),
            "gloo": (lambda: gloo(dist.all_reduce, tensor, mine), equals(total)),
            "floor (ring's transfers and adds)": (floor.run, lambda _: None),
        }
    if collective == "allgather":
        gathered = np.empty(count * size, dtype=np.float32)
        pieces = [torch.empty(count) for _ in range(size)]
        expected = np.repeat(np.arange(1, size + 1, dtype=np.float32), count)
        offsets = [r * count for r in range(size + 1)]

        def direct_allgather(family):
            gathered[rank * count:(rank + 1) * count] = mine
            family.allgather(gathered, offsets)
            return gathered

        return {
            "ringreduce": (lambda: rr.allgather(mine, name="bench"), equals(expected)),
            **{name: (lambda f=family: direct_allgather(f), equals(expected)) for name, family in direct.items()},
            "MPI Allgather": (lambda: world.Allgather(mine, gathered) or gathered, equals(expected)),
            "gloo": (lambda: dist.all_gather(pieces, tensor) or torch.cat(pieces).numpy(), equals(expected)),
        }
    if collective == "broadcast":
        buffer, received = mine.copy(), mine.copy()
        return {
            "ringreduce": (lambda: rr.broadcast(mine, root_rank=0, name="bench"), equals(1.0)),
            # As MPI's here: into a buffer allocated once (the root's holds its own values).
            "ringreduce in place (broadcast_)": (lambda: rr.broadcast_(received, root_rank=0, name="bench_"),
                                                 equals(1.0)),
            **{name: (lambda f=family: f.broadcast(buffer, 0) or buffer, equals(1.0))
               for name, family in direct.items()},
            "MPI Bcast": (lambda: world.Bcast(buffer, root=0) or buffer, equals(1.0)),
            "gloo": (lambda: dist.broadcast(tensor, src=0) or tensor.numpy(), equals(1.0)),
        }
    share = count // size
    rows = mine[:share * size].reshape(size, share)
    out = np.empty(share, dtype=np.float32)
    work = np.empty(share * size, dtype=np.float32)
    offsets = [r * share for r in range(size + 1)]

    def direct_reducescatter(family):
        np.copyto(work, rows.reshape(-1))
        return family.reducescatter(work, offsets, rr.Sum)

    return {
        "ringreduce": (lambda: rr.reducescatter(rows, op=rr.Sum, name="bench"), equals(total)),
        **{name: (lambda f=family: direct_reducescatter(f), equals(total)) for name, family in direct.items()},
        "MPI Reduce_scatter": (lambda: world.Reduce_scatter_block(rows, out, op=MPI.SUM) or out, equals(total)),
        "gloo (all_reduce: gloo has no reduce_scatter)": (lambda: _gloo_reducescatter(rows, rank, share),
                                                           equals(total)),
    }


def _gloo_reducescatter(rows, rank, share):
    tensor = torch.from_numpy(rows.reshape(-1).copy())
    dist.all_reduce(tensor)
    return tensor[rank * share:(rank + 1) * share].numpy()


def gloo(operation, tensor, source):
    tensor.copy_(torch.from_numpy(source))
    operation(tensor)
    return tensor.numpy()


class RingFloor:
    """What a 2(n-1)-step ring must do at least: each step sends and receives one segment
    (a single Sendrecv on buffers allocated once) and, in its first half, adds one segment."""

    def __init__(self, count, size, world):
        self.world, self.size = world, size
        segment = max(count // size, 1)
        self.send = np.ones(segment, dtype=np.float32)
        self.recv = np.empty(segment, dtype=np.float32)
        self.accumulator = np.ones(segment, dtype=np.float32)
        self.right, self.left = (world.rank + 1) % size, (world.rank - 1) % size

    def run(self):
        for step in range(2 * (self.size - 1)):
            self.world.Sendrecv(self.send, self.right, recvbuf=self.recv, source=self.left)
            if step < self.size - 1:
                np.add(self.accumulator, self.recv, out=self.accumulator)


def report(rows, size, waiting):
    print(f"Collective benchmark: {size} ranks, float32, median times; busbw in the nccl-tests convention")
    print(f"{'collective':13s} {'size':>9s} {'implementation':47s} {'time':>10s} {'busbw GB/s':>10s} "
          f"{'vs ringreduce':>13s}")
    ours = {(r["collective"], r["bytes"]): r["seconds"] for r in rows if r["implementation"] == "ringreduce"}
    for row in rows:
        ratio = row["seconds"] / ours[(row["collective"], row["bytes"])]
        print(f"{row['collective']:13s} {_size(row['bytes']):>9s} {row['implementation']:47s} "
              f"{_duration(row['seconds']):>10s} {row['busbw_GBps']:10.2f} {ratio:12.2f}x")
    print("CPU of a rank (all its threads) while it waits 2 s for a late peer, and while idle:")
    for name, share in waiting.items():
        print(f"  {name:40s} {share:6.1%} of a core")
    os.makedirs(RESULTS, exist_ok=True)
    library = " ".join(MPI.Get_library_version().splitlines()[0].split())
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {library}"
    with open(os.path.join(RESULTS, "collectives.json"), "w") as f:
        json.dump({"ranks": size, "machine": machine, "rows": rows, "waiting_cpu_share": waiting}, f, indent=1)
    plot(rows, size, machine)


def plot(rows, size, machine):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = sorted({r["collective"] for r in rows})
    figure, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for axis, collective in zip(axes.flat, collectives, strict=False):
        for name in sorted({r["implementation"] for r in rows if r["collective"] == collective}):
            points = [(r["bytes"], r["busbw_GBps"]) for r in rows
                      if r["collective"] == collective and r["implementation"] == name]
            axis.plot(*zip(*points, strict=True), marker="o", label=name, color=_colour(name))
        axis.set_xscale("log", base=2)
        axis.set_title(collective)
        axis.set_ylabel("bus bandwidth (GB/s)")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    for axis in axes[1]:
        axis.set_xlabel("message size (bytes)")
    figure.suptitle(f"{size} ranks on one host: {machine}", fontsize=9)
    figure.tight_layout()
    figure.savefig(os.path.join(RESULTS, "collectives.png"), dpi=100)


def _colour(name):
    """The same colour for an implementation in every panel."""
    for prefix, colour in (("ringreduce in place", "darkred"), ("ringreduce", "tab:red"),
                           ("ring algorithm", "tab:green"), ("shm algorithm", "tab:purple"),
                           ("MPI", "tab:blue"), ("gloo", "tab:orange")):
        if name.startswith(prefix):
            return colour
    return "tab:gray"


def _size(nbytes):
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes // 1024} KiB"


def _duration(seconds):
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


if __name__ == "__main__":
    main()
