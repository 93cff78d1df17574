"""The short probe that fits the cost model (algorithms/cost.py) to the machines a job runs on: a few
seconds of ping-pongs, reductions, copies, barriers and tiny collectives, collective over the job.

    rrun -np 4 -H a:2,b:2 --calibrate        # saves ~/.cache/ringreduce/profile.json
    RINGREDUCE_CALIBRATE=1 rrun ...          # measures at init instead, for this job only

It measures the parts, never the collectives it predicts: each link's latency and cost per byte
(in cache and from memory) by ping-pong between two ranks while the others wait, the cost per
byte of reducing and of copying on one rank, the shared segment's barrier, and each family's
fixed cost per call from an allreduce of 8 bytes. Three measurements are of data flows rather than
parts: what messages of data just combined cost more between two cores (a ring's two steps at one
size), what reading another core's writes from the shared segment costs more (its allreduce at one
size), and the MPI library's own allreduce, whose internals are its own, at two sizes.
"""

import argparse
import dataclasses
import os
import pathlib
import statistics
import time

import numpy as np
from mpi4py import MPI

from ringreduce.algorithms import cost
from ringreduce.algorithms.families import HalvingDoublingFamily, RingFamily, TreeFamily
from ringreduce.algorithms.mpi_native import MPIAlgorithms
from ringreduce.algorithms.shared_memory import SharedMemory
from ringreduce.machine import topology
from ringreduce.machine.cores import usable_cores
from ringreduce.machine.segment import Segment
from ringreduce.machine.transport import MPITransport, wait_all
from ringreduce.ops import ReduceOp
from ringreduce.planning import profiles
from ringreduce.planning.explain import explain

IN_CACHE = 2 << 20  # beyond a core's L2, inside the shared L3 of the machines we know
# MPI's own allreduce in cache, timed at the sizes where the choice weighs it against the others:
# MPICH's cost per byte falls with the size (2 ranks here: 0.55 ms a MiB at 256 KiB, 0.42 at 1 MiB),
# and timed at 2 MiB it made MPI's own the choice up to 2 MiB, where shared memory is faster.
MPI_IN_CACHE = 256 << 10
FROM_MEMORY = 64 << 20
ACROSS = (256 << 10, 4 << 20)  # a slow network link's cost per byte is the same at any size
SHM_PROBE = 2 << 20  # the shared-memory allreduce's size in the probe: a few pieces, in the cache


def measure(comm, piece_bytes=1 << 20):
    """(cost.Profile fitted on `comm`'s ranks, their cost.JobShape); collective: every rank calls it,
    every rank gets the same profile."""
    place, host_comm, cross_comm = topology.discover(comm)
    probe = _Probe(comm, place)
    # At most half the last-level cache: a collective's arrays share it with the segment, the
    # scratch and the other ranks' arrays (at 16 MiB per rank, 2 ranks already stream partly from
    # memory here); and no more than the copies show (a virtual machine may be told of a cache it
    # gets a small share of).
    caches = probe.agreed(_caches())
    cache_bytes = probe.agreed(probe.cache_for_arrays(max(caches.values(), default=32 << 20) // 2))
    cores = probe.agreed(usable_cores())
    host = probe.link(*probe.host_pair(), (8, IN_CACHE, FROM_MEMORY), cache_bytes)
    network = probe.link(*probe.network_pair(), (8, *ACROSS), cache_bytes) if place.hosts > 1 else None
    combine = probe.per_byte(lambda a, b: np.add(a, b, out=a), cache_bytes)
    copy = probe.per_byte(lambda a, b: np.copyto(a, b), cache_bytes)
    segment = Segment(host_comm, place.local_size * piece_bytes) if place.local_size > 1 else None
    barrier = probe.barrier(segment)
    pair = probe.host_pair()
    mpi = cost.Link(probe._ping_pong(*pair, 8, 200, *probe.mpis()), host.beta) if pair[0] is not None else host
    draft = cost.Profile(host=host, network=network, mpi=mpi, combine=combine, copy=copy, barrier=barrier, calls={},
                         cache_bytes=cache_bytes, cores=cores, core_cache_bytes=caches.get(2, 0),
                         shm_piece_bytes=piece_bytes, source="measured")
    draft = dataclasses.replace(draft, host=dataclasses.replace(host, fresh=probe.fresh(*pair, draft)))
    draft = dataclasses.replace(draft, shm_handover=probe.shm_handover(segment, draft, place))
    families = _families(comm, segment, cross_comm, place)
    draft = dataclasses.replace(draft, mpi=dataclasses.replace(
        mpi, exchange=probe.mpi_per_byte(families["mpi"], draft, place)))
    shape = cost.JobShape(place.size, place.hosts, place.homogeneous)
    model = cost.Model(draft, shape)
    calls = {name: max(0.0, probe.call(family) - getattr(model, "_allreduce_" + name)(8))
             for name, family in families.items()}
    if segment is not None:
        segment.close()
    host_comm.Free()
    cross_comm.Free()
    if pair[0] is not None:  # last: see _Probe.crowded
        host = dataclasses.replace(draft.host, crowded_alpha=probe.crowded(*pair, *probe.ours()))
        mpi = dataclasses.replace(draft.mpi, crowded_alpha=probe.crowded(*pair, *probe.mpis()))
        draft = dataclasses.replace(draft, host=host, mpi=mpi)
    return dataclasses.replace(draft, calls=calls), shape


def _families(comm, segment, cross_comm, place):
    transport = MPITransport(comm)
    families = {"ring": RingFamily(transport, 4 << 20), "halving_doubling": HalvingDoublingFamily(transport, 4 << 20),
                "tree": TreeFamily(transport, 4 << 20), "mpi": MPIAlgorithms(transport)}
    if segment is not None and place.hosts == 1:
        families["shm"] = SharedMemory(segment)
    elif segment is not None and place.homogeneous:
        families["hierarchical"] = SharedMemory(segment, RingFamily(MPITransport(cross_comm), 4 << 20).allreduce)
    return families


def _current_cpu(stat=pathlib.Path("/proc/thread-self/stat")):
    """The CPU this thread runs on (Linux: the 39th field of its stat), None where it is not known."""
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def _caches(root=pathlib.Path("/sys/devices/system/cpu/cpu0/cache")):
    """{level: bytes} of the caches this host's first core reports (sysfs; empty where it does not say)."""
    sizes = {}
    for entry in root.glob("index*"):
        try:
            level, text = int((entry / "level").read_text()), (entry / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        size = int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text)
        sizes[level] = max(size, sizes.get(level, 0))
    return sizes


class _Probe:
    def __init__(self, comm, place):
        self.comm, self.place = comm, place
        self.transport = MPITransport(comm)

    def agreed(self, value):
        """Rank 0's value, on every rank (hosts may differ; the model takes one)."""
        return self.comm.bcast(value, root=0)

    def together(self):
        """Wait for every rank without spinning a core (the idle ranks of a measurement)."""
        wait_all([self.comm.Ibarrier()])

    def host_pair(self):
        return (0, 1) if self.place.local_size > 1 else (None, None)

    def network_pair(self):
        """Rank 0 and the first rank of another host."""
        first = self.comm.allgather(self.place.local_rank == 0 and self.place.cross_rank == 1)
        return 0, first.index(True)

    def _on_pair(self, a, b, reps, prepare):
        """Every rank's copy of rank a's median seconds of one round between ranks a and b, the
        others waiting: on each of the two, `prepare(other)` allocates and returns the round, which
        runs `reps` times after one not counted."""
        times = []
        if self.comm.rank in (a, b):
            once = prepare(b if self.comm.rank == a else a)
            for _ in range(reps + 1):
                start = time.perf_counter()
                once()
                times.append(time.perf_counter() - start)
        self.together()
        return self.agreed(statistics.median(times[1:]) if self.comm.rank == a else None)

    def _ping_pong(self, a, b, nbytes, reps, send, recv):
        """Median one-way seconds of a message of `nbytes` between ranks a and b."""
        def prepare(other):
            buf = np.ones(max(nbytes, 1), np.uint8)[:nbytes]
            first, second = (send, recv) if self.comm.rank == a else (recv, send)
            return lambda: (first(buf, other), second(buf, other))

        return self._on_pair(a, b, reps, prepare) / 2

    def link(self, a, b, sizes, cache_bytes):
        """A cost.Link of ringreduce's own messages between ranks a and b: the latency from
        ping-pongs at the first size, alone and with both ranks on one core; the cost per byte in
        cache and from memory at the other two, by ping-pong and by both ranks exchanging at once."""
        if a is None:
            return cost.DEFAULT.host
        send, recv = self.ours()
        alpha = self._ping_pong(a, b, sizes[0], 200, send, recv)
        reps = [max(3, min(50, (64 << 20) // n)) for n in sizes[1:]]
        one_way = [self._ping_pong(a, b, n, r, send, recv) - alpha for n, r in zip(sizes[1:], reps, strict=True)]
        both = [self._exchange(a, b, n, r) - alpha for n, r in zip(sizes[1:], reps, strict=True)]
        return cost.Link(alpha, _fit(sizes[1:], one_way, lambda n: 2 * n, cache_bytes),
                         _fit(sizes[1:], both, lambda n: 4 * n, cache_bytes))

    def _exchange(self, a, b, nbytes, reps):
        """Median seconds of ranks a and b sending each other `nbytes` at the same time."""
        def prepare(other):
            out, into = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
            return lambda: self.transport.sendrecv(out, other, into, other)

        return self._on_pair(a, b, reps, prepare)

    def fresh(self, a, b, draft):
        """cost.Link.fresh on ranks a and b: two exchanges of a ring's allreduce on two ranks (the
        second sends what was just combined from the first) at a size whose messages the model
        counts wholly in a core's cache, less what the `draft` profile predicts for them, per byte.
        The draft's where there is no pair on one host; None where the core's cache is too small to
        tell."""
        if a is None:
            return draft.host.fresh
        model = cost.Model(draft, cost.JobShape(2))
        nbytes = min(1 << 20, max(16 << 10, draft.core_cache_bytes // 8))
        share = model._in_core(nbytes)
        if share == 0:
            return None

        def prepare(other):
            mine, theirs, scratch = (np.ones(nbytes // 4, np.float32) for _ in range(3))

            def two_steps():
                self.transport.sendrecv(theirs, other, scratch, other)
                np.add(mine, scratch, out=mine)
                self.transport.sendrecv(mine, other, theirs, other)
            return two_steps

        measured = self._on_pair(a, b, max(3, min(100, (64 << 20) // nbytes)), prepare)
        ws = model._working_set(2 * nbytes)
        predicted = 2 * model._send(nbytes, False, ws, exchange=True) + model._combine(nbytes, ws)
        return max(0.0, measured - predicted) / (2 * nbytes * share)

    def crowded(self, a, b, send, recv):
        """One-way latency of 8-byte ping-pongs with ranks a and b on the same core (the first
        of rank a's), as ranks beyond a host's cores run. Measured last, and each rank is put back
        on the core it ran on before: given all its cores back, a process stays on the shared one
        for a while (both ranks did, and a job's first allreduces after the probe took 2.6x as long;
        docs/cost_model.md)."""
        if not hasattr(os, "sched_setaffinity"):
            return None
        mine = os.sched_getaffinity(0)
        core = self.agreed(min(mine))
        pinned = self.comm.rank in (a, b)
        was_on = _current_cpu() if pinned else None
        if pinned:
            os.sched_setaffinity(0, {core})
        try:
            return self._ping_pong(a, b, 8, 60, send, recv)
        finally:
            if was_on in mine:
                os.sched_setaffinity(0, {was_on})  # moves it there now
            os.sched_setaffinity(0, mine)

    def ours(self):
        """Send and receive as ringreduce's families do: non-blocking, waited without spinning."""
        t = self.transport
        return lambda buf, peer: t.wait([t.isend(buf, peer)]), lambda buf, peer: t.wait([t.irecv(buf, peer)])

    def mpis(self):
        """Send and receive as the MPI library does inside its collectives: blocking, spinning."""
        return lambda buf, peer: self.comm.Send(buf, peer), lambda buf, peer: self.comm.Recv(buf, peer)

    def cache_for_arrays(self, ceiling):
        """The working set up to which copies on rank 0 run at the in-cache speed (see
        _cache_from_sweep), at most `ceiling` bytes."""
        sizes = [IN_CACHE << k for k in range(6)]  # arrays of 2 to 64 MiB: working sets of 4 to 128 MiB
        seconds = self._on_rank_0(np.copyto, sizes, 128 << 20)
        return _cache_from_sweep([2 * n for n in sizes], seconds, ceiling)

    def per_byte(self, work, cache_bytes):
        """cost.PerByte of `work(a, b)` on two arrays, timed on rank 0 alone."""
        times = self._on_rank_0(work, (IN_CACHE, FROM_MEMORY), 64 << 20)
        return _fit((IN_CACHE, FROM_MEMORY), times, lambda n: 2 * n, cache_bytes)

    def _on_rank_0(self, work, sizes, budget):
        """Every rank's copy of the median seconds of `work(a, b)` on rank 0 alone, for two arrays
        of each of `sizes` bytes: at most `budget` bytes' worth of runs (3 to 50), the first not counted."""
        times = []
        if self.comm.rank == 0:
            for nbytes in sizes:
                a, b = np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
                samples = []
                for _ in range(max(3, min(50, budget // nbytes)) + 1):
                    start = time.perf_counter()
                    work(a, b)
                    samples.append(time.perf_counter() - start)
                times.append(statistics.median(samples[1:]))
        self.together()
        return self.agreed(times)

    def barrier(self, segment):
        if segment is None:
            return cost.DEFAULT.barrier
        self.together()
        for _ in range(10):
            segment.barrier()
        start = time.perf_counter()
        for _ in range(200):
            segment.barrier()
        return self.agreed((time.perf_counter() - start) / 200)

    def _allreduce_seconds(self, family, nbytes, reps):
        buf = np.zeros(max(1, nbytes // 4), np.float32)  # summed again and again: ones would overflow
        samples = []
        for _ in range(reps + 1):
            self.comm.Barrier()  # MPI's own: it spins, so every rank leaves it within microseconds
            start = time.perf_counter()
            family.allreduce(buf, ReduceOp.SUM)
            samples.append(time.perf_counter() - start)
        return self.agreed(max(self.comm.allgather(statistics.median(samples[1:]))))

    def shm_handover(self, segment, draft, place):
        """cost.Profile.shm_handover: the shared-memory allreduce of SHM_PROBE bytes on every
        host's ranks at once, less what the `draft` profile predicts for it, per byte a rank reads
        from the slots the others have just written. 0 where a host has one rank."""
        if segment is None:
            return 0.0
        measured = self._allreduce_seconds(SharedMemory(segment), SHM_PROBE, 30)
        k = place.local_size
        predicted = cost.Model(draft, cost.JobShape(k))._allreduce_shm(SHM_PROBE)
        return max(0.0, measured - predicted) / (2 * (k - 1) / k * SHM_PROBE)

    def call(self, family):
        return self._allreduce_seconds(family, 8, 100)

    def mpi_per_byte(self, family, draft, place):
        """The MPI library's cost per byte on one host: its allreduce timed in cache and from
        memory, less what the model already accounts for (its messages, the reductions). Across
        hosts the network hides it: there it is taken as ringreduce's own exchanges'. The two are
        kept as measured even where the larger costs less per byte: the library changes algorithms
        with the size (3 ranks of 2 cores: 3.2 ms a MiB at 256 KiB, 1.9 at 64 MiB), and forced up to
        the smaller one's, 16-256 MiB came out 2.4-3.1x slow (docs/cost_model.md)."""
        if place.hosts > 1:
            return draft.host.exchange
        shape = cost.JobShape(place.size)
        sizes = (MPI_IN_CACHE, FROM_MEMORY)
        measured = [self._allreduce_seconds(family, n, max(3, min(30, (64 << 20) // n))) for n in sizes]

        def predicted(per_byte, n):
            profile = dataclasses.replace(draft, mpi=dataclasses.replace(draft.mpi, exchange=per_byte))
            return cost.Model(profile, shape)._allreduce_mpi(n)

        # The model is linear in each per-byte value: solve for the one that matches each size.
        cache = _solve(lambda x: predicted(cost.PerByte(x, x), MPI_IN_CACHE), measured[0])
        memory = _solve(lambda x: predicted(cost.PerByte(cache, x), FROM_MEMORY), measured[1])
        return cost.PerByte(cache, memory)


def _solve(f, target):
    """x with f(x) == target, for f linear in x (x >= 0)."""
    base = f(0.0)
    return max(0.0, (target - base) / (f(1e-9) - base) * 1e-9)


SLOWER = 1.25  # a copy this much slower per byte than in cache no longer runs in cache


def _cache_from_sweep(working_sets, seconds, ceiling):
    """The largest of the increasing `working_sets` (of copies that took `seconds`) before the
    first whose cost per byte is SLOWER than the first's; `ceiling` where none is."""
    first = seconds[0] / working_sets[0]
    for index in range(1, len(working_sets)):
        if seconds[index] / working_sets[index] > SLOWER * first:
            return min(ceiling, working_sets[index - 1])
    return ceiling


def _fit(sizes, seconds, working_set, cache_bytes):
    """cost.PerByte from seconds at a size in cache and one beyond it (see PerByte.at). Where less
    than half the larger size's working set lies beyond the cache, its cost per byte is taken as
    the memory's: solving for it would multiply the measurement's noise by up to 1 / beyond."""
    small, large = sizes
    cache = max(seconds[0], 0.0) / small
    beyond = max(0.0, 1.0 - cache_bytes / working_set(large))
    per_byte = max(seconds[1], 0.0) / large
    memory = cache + (per_byte - cache) / beyond if beyond >= 0.5 else per_byte
    return cost.PerByte(cache, max(memory, cache))


def main(argv=None):
    """`python -m ringreduce.planning.calibration [--save PATH]`, under rrun (what `rrun
    --calibrate` runs): measure, save on rank 0, print the profile and the choice it makes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", default=None, help="where to save the profile (default: %(default)s)")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    profile, shape = measure(comm)
    if comm.rank == 0:
        path = profiles.save(profile, args.save)
        print(f"ringreduce: saved the profile measured on {shape.ranks} ranks, {shape.hosts} host(s) to {path}")
        print(explain(dataclasses.replace(profile, source=str(path)), shape))


if __name__ == "__main__":
    main()
