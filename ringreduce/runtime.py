"""This process's ringreduce state: init and shutdown, where the process sits (rank(), size()
and the rest), the engine, and the hooks that make a failing rank end the whole job instead of
leaving the others waiting.
"""

import atexit
import os
import signal
import sys
import threading

from mpi4py import MPI
from mpi4py.run import set_abort_status

from ringreduce import preemption
from ringreduce.algorithms import choice
from ringreduce.config import Config
from ringreduce.engine.loop import Engine
from ringreduce.engine.requests import Handle
from ringreduce.engine.timeline import NoTimeline, Timeline
from ringreduce.engine.wire import Wire
from ringreduce.errors import NotInitializedError, RingReduceError
from ringreduce.launcher import protocol
from ringreduce.machine import gpu, topology

_active = None
_hooks_installed = False


class Runtime:
    def __init__(self, comm, config):
        self.config = config
        engine_comm = comm.Dup()
        self.topology, host_comm, cross_comm = topology.discover(engine_comm, config.simulated_hosts)
        selector = choice.select(config, self.topology, engine_comm, host_comm, cross_comm)
        gpu.select_device(self.topology.local_rank)
        shared_bits = engine_comm.allreduce(gpu.local_capabilities(host_comm), op=MPI.BAND)
        self.gpu_transport = gpu.choose_transport(config.gpu_transport, shared_bits)
        device_family = choice.device_family(self.gpu_transport, selector, engine_comm, config)
        timeline = Timeline(config.timeline, self.topology.rank) if config.timeline and \
            self.topology.rank == 0 else NoTimeline()

        def release():
            for communicator in (host_comm, cross_comm, engine_comm):
                communicator.Free()

        self.engine = Engine(Wire(engine_comm, config.cache_capacity), selector, config, timeline, device_family,
                             release, self._tell_rrun_leaving if protocol.under_rrun() else None)
        self.failing = False
        self._names = 0
        self._names_lock = threading.Lock()

    def _tell_rrun_leaving(self, why):
        """This rank is leaving while others wait for it: no failure by itself, but to blame if
        the others then fail."""
        _tell_rrun(protocol.status_line(self.topology.rank, 0, left=why))

    def auto_name(self):
        """Names for unnamed calls: the same on every rank that makes its calls in the same order."""
        with self._names_lock:
            self._names += 1
            return f"noname.{self._names}"

    def close(self):
        handle = Handle("shutdown")
        self.engine.shutdown(handle)
        handle.wait()
        if self.config.straggler_report and self.topology.rank == 0:
            print(straggler_table(self.engine.straggler_report, self.engine.negotiator.stragglers.cycles),
                  file=sys.stderr, flush=True)


def init(comm=None):
    """Start ringreduce on `comm` (default: MPI.COMM_WORLD). Calling it again does nothing."""
    global _active
    if _active is not None:
        return
    comm = MPI.COMM_WORLD if comm is None else comm
    _check_launch(comm)
    _check_thread_level()
    _active = Runtime(comm, Config.from_env())
    _install_hooks()
    preemption.install()


def shutdown():
    """Leave the job cleanly: waits until every other rank has shut down too. Requests still
    pending on this rank fail; on the other ranks, requests that needed this one fail too."""
    global _active
    if _active is None:
        return
    runtime, _active = _active, None
    runtime.close()


def is_initialized():
    return _active is not None


def is_homogeneous():
    """Does every host run the same number of ranks?"""
    return active().topology.homogeneous


def mpi_threads_supported():
    """Did MPI start with MPI_THREAD_MULTIPLE, so that the program may call MPI itself (through
    mpi4py) beside ringreduce?"""
    active()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def start_timeline(file_path, mark_cycles=False):
    """Start recording a timeline (a Chrome trace, written by rank 0) into `file_path`, in place of
    any recorded so far; `mark_cycles` adds a mark for each engine cycle that ran something."""
    runtime = active()
    if runtime.topology.rank == 0:
        runtime.engine.record_to(Timeline(file_path, 0, mark_cycles))


def stop_timeline():
    """Stop recording the timeline and close its file."""
    runtime = active()
    if runtime.topology.rank == 0:
        runtime.engine.record_to(NoTimeline())


def _where(field, doc):
    """A query of this process's place in the job, answered once ringreduce is initialized."""
    def query():
        return getattr(active().topology, field)
    query.__name__ = query.__qualname__ = field
    query.__doc__ = doc
    return query


rank = _where("rank", "This process's rank in the job, 0 to size() - 1.")
size = _where("size", "The number of ranks in the job.")
local_rank = _where("local_rank", "This process's rank among the ranks on its host.")
local_size = _where("local_size", "The number of ranks on this process's host.")
cross_rank = _where("cross_rank", "This process's host, among the hosts (the rank of its local rank's group).")
cross_size = _where("cross_size", "The number of ranks with this process's local rank: the hosts that have one.")


def active():
    if _active is None:
        raise NotInitializedError("ringreduce has not been initialized; call ringreduce.init() first")
    return _active


def engine_stats():
    """Counters of the engine's work so far: cycles, collectives, tensors and bytes, cache hits,
    and the cycles whose negotiation needed every rank's full state (state_gathers)."""
    engine = active().engine
    return {**engine.stats, "cache_hits": engine.negotiator.cache_hits, "state_gathers": engine.wire.gathers}


def straggler_report():
    """Per rank that was ever the last one ready: in what share of the cycles that ran something
    it was last, and how long it kept the others waiting then, on average."""
    engine = active().engine
    return {"cycles": engine.negotiator.stragglers.cycles,
            "ranks": [{"rank": r, "share_last": share, "mean_late_seconds": late}
                      for r, share, late in engine.straggler_report]}


def straggler_table(rows, cycles):
    lines = [f"ringreduce straggler report ({cycles} cycles ran collectives):"]
    for rank, share, late in rows:
        lines.append(f"  rank {rank} was last in {share:.0%} of cycles, {late * 1000:.1f} ms late on average")
    if not rows:
        lines.append("  no rank kept the others waiting")
    return "\n".join(lines)


def _check_launch(comm):
    """Catch the classic mix-up of a launcher and an mpi4py built on another MPI: each process
    then starts as a world of its own."""
    if comm == MPI.COMM_WORLD:
        problem = launch_mismatch(comm.size, os.environ)
        if problem:
            library = MPI.Get_library_version().splitlines()[0].strip()
            raise RingReduceError(problem.format(library=library))


def launch_mismatch(world_size, environ):
    """What is wrong when the world MPI reports is not the one the launcher started (a message
    with `{library}` to fill in), or None. rrun says how many ranks it started; without rrun, srun
    says how many tasks its step has. (When rrun starts Open MPI's daemons through srun, the ranks
    inherit a step of one task per node: rrun's count is the one that counts then.)"""
    started = environ.get(protocol.WORLD_SIZE_VARIABLE)
    if started is not None:
        return None if int(started) == world_size else (
            f"rrun started {started} ranks but MPI reports a world of {world_size}: the mpiexec that rrun "
            "ran belongs to a different MPI than the one mpi4py loaded ({library}). Run `rrun --check-build`, "
            "and point rrun at the matching mpiexec (--mpiexec or RRUN_MPIEXEC) or rebuild mpi4py against the "
            "site's MPI (docs/cluster.md).")
    tasks = environ.get("SLURM_STEP_NUM_TASKS")
    if tasks is None or "SLURM_PROCID" not in environ or int(tasks) == world_size:
        return None
    return (f"srun started {tasks} tasks in this step but MPI reports a world of {world_size}: srun and the MPI "
            "that mpi4py loaded ({library}) do not share a process-management interface. Start the job with "
            "`srun --mpi=pmix` (or --mpi=pmi2, whichever the site's MPI was built for; `srun --mpi=list` shows "
            "what Slurm offers), or with rrun (docs/cluster.md).")


def _check_thread_level():
    """The engine calls MPI from its own thread and from callers' threads that run a cycle, one at
    a time: the library must allow calls from any thread (MPI_THREAD_SERIALIZED or more)."""
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_SERIALIZED:
        name = "MPI_THREAD_SINGLE" if provided == MPI.THREAD_SINGLE else "MPI_THREAD_FUNNELED"
        raise RingReduceError(
            f"MPI was started with {name}, but ringreduce calls MPI from its engine thread and needs "
            "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE; mpi4py asks for MULTIPLE unless "
            "mpi4py.rc.thread_level or MPI4PY_RC_THREAD_LEVEL says otherwise")


def _install_hooks():
    """On an uncaught exception, abort the whole MPI job so the other ranks do not wait for
    this one forever; at a normal exit, shut down cleanly."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    previous = sys.excepthook

    def abort_job_on_uncaught(exc_type, exc, traceback):
        previous(exc_type, exc, traceback)
        if _active is None or _active.topology.size == 1:
            return
        _active.failing = True
        code = 128 + signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
        if protocol.under_rrun():
            error = f"{exc_type.__module__}.{exc_type.__qualname__}: {exc}".removeprefix("builtins.")
            _tell_rrun(protocol.status_line(_active.topology.rank, code, error))
        set_abort_status(code)

    sys.excepthook = abort_job_on_uncaught
    atexit.register(_shutdown_at_exit)


def _tell_rrun(line):
    sys.stderr.buffer.write(line)
    sys.stderr.flush()


def _shutdown_at_exit():
    if _active is not None and not _active.failing:
        shutdown()
