"""Checks at init that MPI started this process as the launcher meant: in the world the launcher
started (not a world of one, from an mpi4py built on another MPI), with threads enough for the engine."""

import os

from mpi4py import MPI

from ringreduce.errors import RingReduceError
from ringreduce.launcher import protocol


def check_launch(comm):
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


def check_thread_level():
    """The engine calls MPI from its own thread and from callers' threads that run a cycle, one at
    a time: the library must allow calls from any thread (MPI_THREAD_SERIALIZED or more)."""
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_SERIALIZED:
        name = "MPI_THREAD_SINGLE" if provided == MPI.THREAD_SINGLE else "MPI_THREAD_FUNNELED"
        raise RingReduceError(
            f"MPI was started with {name}, but ringreduce calls MPI from its engine thread and needs "
            "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE; mpi4py asks for MULTIPLE unless "
            "mpi4py.rc.thread_level or MPI4PY_RC_THREAD_LEVEL says otherwise")
