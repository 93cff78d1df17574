"""Where a call's time goes, phase by phase: the meeting in program order, the engine's state
exchange, the rest of its cycle, the execution (packing, the algorithm, handing out the result:
in the engine's cycle, or on the caller's thread after the meeting) and what lies outside all of
them (argument checks, the hand-over to the cycles, waking the caller). Plain calls, and an
async allreduce waited for at once (`allreduce_async(x).wait()`: the engine's path, which the
framework adapters' gradient hooks take). Each phase is timed by wrapping the method that runs
it, on rank 0, over many calls in a row; the family's own collective and MPI's are timed alone
in the same run.

With --trace KIND KIB, every rank stamps the boundaries of a plain call's phases instead (the
meeting, its exchange, the executor, the family on the caller's thread; `time.perf_counter_ns`
is one clock for every process of a host) and rank 0 prints each rank's medians from its own
call's start: who waits for whom, and where the Python between the phases goes.

    rrun -np 2 python benchmarks/engine_phases.py
    rrun -np 2 python benchmarks/engine_phases.py --trace allreduce 256
"""

import argparse
import collections
import time

import numpy as np
from mpi4py import MPI

import ringreduce as rr
from ringreduce import runtime
from ringreduce.engine import loop, plain_calls
from ringreduce.execution import host
from ringreduce.machine.layout import even_counts, offsets_of

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20]
PHASES = {  # phase -> (class, method) whose calls it adds up
    "meeting in program order": (plain_calls.PlainCalls, "run"),
    "state exchange": (loop.Engine, "_exchange_states"),
    "cycle": (loop.Engine, "_cycle"),
    "execution": (host.Executor, "run"),
    "the caller's execution": (plain_calls.PlainCalls, "_execute"),  # inside the meeting's time
}


def timed(totals, phase, method):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals[phase] += time.perf_counter() - start
    return wrapper


def per_call(run, calls):
    MPI.COMM_WORLD.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - start) / calls


def measure(kind, size, algorithms, comm, calls, totals):
    """(kind, size, whole call, {phase: seconds}, the family alone, MPI's own), per call."""
    x = np.ones(size // 4, np.float32)
    if kind.startswith("allreduce"):
        out = np.empty_like(x)
        call = ((lambda: rr.allreduce_async(x, op=rr.Sum, name="phases.a").wait()) if kind == "allreduce async"
                else lambda: rr.allreduce(x, op=rr.Sum, name="phases"))
        alone, mpi = lambda: algorithms.allreduce(out, rr.Sum, x), lambda: comm.Allreduce(x, out)
    elif kind == "reducescatter":
        work, out = np.empty_like(x), np.empty(x.size // comm.size, np.float32)
        offsets = offsets_of(even_counts(x.size, comm.size))
        call, alone, mpi = (lambda: rr.reducescatter(x, op=rr.Sum, name="phases.r"),
                            lambda: algorithms.reducescatter(work, offsets, rr.Sum, x),
                            lambda: comm.Reduce_scatter_block(x[:out.size * comm.size], out))
    elif kind == "broadcast":
        out = np.empty_like(x)
        call, alone, mpi = (lambda: rr.broadcast(x, root_rank=0, name="phases.b"),
                            lambda: algorithms.broadcast(out, 0, x), lambda: comm.Bcast(out if comm.rank else x, 0))
    else:
        out, offsets = np.empty(x.size * comm.size, np.float32), offsets_of([x.size] * comm.size)
        call, alone, mpi = (lambda: rr.allgather(x, name="phases.g"), lambda: algorithms.allgather(out, offsets),
                            lambda: comm.Allgather(x, out))
    per_call(call, 20)  # warm-up: plans, the cache
    totals.clear()
    whole = per_call(call, calls)
    phases = {phase: totals[phase] / calls for phase in PHASES}
    return kind, size, whole, phases, per_call(alone, calls), per_call(mpi, calls)


# The boundaries --trace stamps: (owner, method) -> label; the family's is added on the caller's
# executor's algorithms.
TRACED = {(plain_calls.PlainCalls, "run"): "meeting", (plain_calls.PlainCalls, "_receive"): "exchange",
          (host.Executor, "run"): "executor"}


def stamped(stamps, label, method):
    def wrapper(*args, **kwargs):
        stamps.append((label + ">", time.perf_counter_ns()))
        try:
            return method(*args, **kwargs)
        finally:
            stamps.append((label + "<", time.perf_counter_ns()))
    return wrapper


def trace(kind, size, calls):
    """Each rank's median stamps of `calls` plain calls of `kind`, `size` bytes, in us from rank 0's
    start of the same call, printed on rank 0."""
    stamps = []
    for (owner, name), label in TRACED.items():
        setattr(owner, name, stamped(stamps, label, getattr(owner, name)))
    family = runtime.active().engine.caller_executor.algorithms
    setattr(family, kind, stamped(stamps, "family", getattr(family, kind)))
    x = np.ones(size // 4, np.float32)
    call = {"allreduce": lambda: rr.allreduce(x, op=rr.Sum, name="traced"),
            "reducescatter": lambda: rr.reducescatter(x, op=rr.Sum, name="traced"),
            "allgather": lambda: rr.allgather(x, name="traced"),
            "broadcast": lambda: rr.broadcast(x, root_rank=0, name="traced")}[kind]
    for _ in range(100):
        call()
    MPI.COMM_WORLD.Barrier()
    stamps.clear()
    for _ in range(calls):
        call()
    labels = [label for label, _ in stamps[:len(stamps) // calls]]
    times = np.array([t for _, t in stamps], dtype=np.int64).reshape(calls, len(labels))
    everyone = MPI.COMM_WORLD.gather(times, 0)
    if MPI.COMM_WORLD.rank == 0:
        start = everyone[0][:, :1]
        print(f"plain {kind} of {size >> 10} KiB, {len(everyone)} ranks: median us from rank 0's start of each "
              f"call ({calls} calls); a call every {np.median(np.diff(everyone[0][:, 0])) / 1e3:.1f} us on rank 0")
        for rank, mine in enumerate(everyone):
            medians = np.median((mine - start) / 1e3, axis=0)
            print(f"  rank {rank}: " + "  ".join(f"{label} {value:.1f}"
                                                 for label, value in zip(labels, medians, strict=True)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--trace", nargs=2, metavar=("KIND", "KIB"),
                        help="stamp the phases of plain KIND calls of KIB KiB on every rank instead")
    args = parser.parse_args()
    rr.init()
    if args.trace:
        trace(args.trace[0], int(args.trace[1]) << 10, max(args.calls, 1000))
        rr.shutdown()
        return
    totals = collections.Counter()
    for phase, (owner, name) in PHASES.items():
        setattr(owner, name, timed(totals, phase, getattr(owner, name)))
    algorithms = runtime.active().engine.algorithms
    comm = MPI.COMM_WORLD
    kinds = {"allreduce": SIZES, "allreduce async": SIZES[:3], "reducescatter": SIZES[:2], "allgather": SIZES[:2],
             "broadcast": SIZES[:2]}
    rows = [measure(kind, size, algorithms, comm, args.calls, totals)
            for kind, sizes in kinds.items() for size in sizes]
    if rr.rank() == 0:
        print(f"where a call's time goes, {comm.size} ranks, rank 0, us per call ({args.calls} calls in a "
              "row)")
        print(f"{'call':>22} {'whole':>7} {'meeting':>8} {'states':>7} {'cycle*':>7} {'execute':>8} "
              f"{'outside':>8} {'family':>7} {'MPI':>6}")
        for kind, size, whole, phases, alone, mpi in rows:
            meeting, states, cycle, execution, callers = (phases[p] * 1e6 for p in PHASES)
            outside = whole * 1e6 - meeting - cycle
            print(f"{kind:>15} {size >> 10:>4} KiB {whole * 1e6:7.0f} {meeting - callers:8.0f} {states:7.0f} "
                  f"{cycle - states - (execution - callers):7.0f} {execution:8.0f} {outside:8.0f} "
                  f"{alone * 1e6:7.0f} {mpi * 1e6:6.0f}")
        print("cycle*: the engine cycle's own work beyond the state exchange and the execution")
    rr.shutdown()


if __name__ == "__main__":
    main()
