"""Every tuning knob in one place, read from RINGREDUCE_* environment variables.

rrun's flags set the same variables, so a job can be tuned either way. Names and defaults
follow Horovod's where Horovod has the same knob.
"""

import dataclasses
import os

ALGORITHMS = ("auto", "ring", "shm", "mpi", "halving_doubling", "tree")
GPU_TRANSPORTS = ("auto", "nccl", "mpi", "staged")


@dataclasses.dataclass(frozen=True)
class Config:
    # "auto": chosen per collective, size and topology by the cost model (algorithms/cost.py);
    # "ring": the ring over MPI point-to-point; "halving_doubling" and "tree": recursive halving and
    # doubling, a binomial tree; "shm": shared memory inside each host; "mpi": the MPI library's own.
    algorithm: str = "auto"
    # Fit the cost model on this job's ranks at init (a probe of about a second) instead of loading
    # the saved profile (RINGREDUCE_PROFILE, ~/.cache/ringreduce/profile.json, from rrun --calibrate).
    calibrate: bool = False
    # Large transfers are split into pieces of this many bytes so that the reduction of one
    # piece overlaps the transfer of the next.
    pipeline_chunk_bytes: int = 4 << 20
    # Each rank's share of the shared-memory segment: data crosses it in pieces of this size.
    shared_memory_piece_bytes: int = 1 << 20
    # Collectives of CuPy arrays: "auto" takes NCCL where every rank has it, else CUDA-aware MPI
    # where the library takes device buffers, else "staged" through pinned host memory.
    gpu_transport: str = "auto"
    # Allreduce across hosts as shared memory inside each host plus a ring across hosts.
    # None: whenever the job spans hosts with the same number of ranks each.
    hierarchical: bool | None = None
    # Treat the ranks as this many hosts (consecutive groups), to test cross-host paths on one.
    simulated_hosts: int | None = None
    # The longest a request that is ready on every rank waits for the engine's next cycle.
    cycle_time_ms: float = 1.0
    # How many negotiated requests the engine remembers, so repeats need one bit, not a message.
    cache_capacity: int = 1024
    # Ready allreduces are packed into buffers of up to this many bytes (0: no fusion).
    fusion_threshold_bytes: int = 128 << 20
    timeline: str | None = None
    stall_check_seconds: float = 60.0
    stall_shutdown_seconds: float | None = None
    # Every rank blocked in a wait this long with nothing new submitted anywhere, for requests that
    # others have not submitted: a deadlock, whose requests fail on every rank (0: never).
    deadlock_seconds: float = 5.0
    # With a stall warning, each rank also prints every thread's Python stack.
    stall_stacks: bool = False
    straggler_report: bool = False
    # Plain allreduces on up to 8 ranks pair up in program order, small ones with their data
    # (engine/plain_calls.py); off: through the engine, as every other call.
    program_order: bool = True

    @classmethod
    def from_env(cls, environ=os.environ):
        algorithm = environ.get("RINGREDUCE_ALGORITHM", cls.algorithm).strip().lower()
        if algorithm not in ALGORITHMS:
            raise ValueError(f"RINGREDUCE_ALGORITHM={algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        gpu_transport = environ.get("RINGREDUCE_GPU_TRANSPORT", cls.gpu_transport).strip().lower()
        if gpu_transport not in GPU_TRANSPORTS:
            raise ValueError(f"RINGREDUCE_GPU_TRANSPORT={gpu_transport!r} is not one of {', '.join(GPU_TRANSPORTS)}")
        hierarchical = _switch(environ, "RINGREDUCE_HIERARCHICAL")
        if hierarchical and algorithm not in ("auto", "shm"):
            raise ValueError(f"RINGREDUCE_HIERARCHICAL=1 needs RINGREDUCE_ALGORITHM auto or shm, not {algorithm}")
        return cls(
            algorithm=algorithm,
            gpu_transport=gpu_transport,
            pipeline_chunk_bytes=_number(environ, "RINGREDUCE_PIPELINE_CHUNK_BYTES", cls.pipeline_chunk_bytes,
                                         int, minimum=1),
            shared_memory_piece_bytes=_number(environ, "RINGREDUCE_SHM_PIECE_BYTES",
                                              cls.shared_memory_piece_bytes, int, minimum=64),
            hierarchical=hierarchical,
            simulated_hosts=_number(environ, "RINGREDUCE_SIMULATED_HOSTS", None, int, minimum=1),
            cycle_time_ms=_number(environ, "RINGREDUCE_CYCLE_TIME", cls.cycle_time_ms, float, minimum=0),
            cache_capacity=_number(environ, "RINGREDUCE_CACHE_CAPACITY", cls.cache_capacity, int, minimum=0),
            fusion_threshold_bytes=_number(environ, "RINGREDUCE_FUSION_THRESHOLD", cls.fusion_threshold_bytes,
                                           int, minimum=0),
            timeline=environ.get("RINGREDUCE_TIMELINE") or None,
            stall_check_seconds=_number(environ, "RINGREDUCE_STALL_CHECK_TIME", cls.stall_check_seconds,
                                        float, minimum=0),
            stall_shutdown_seconds=_number(environ, "RINGREDUCE_STALL_SHUTDOWN_TIME", None, float, minimum=0),
            deadlock_seconds=_number(environ, "RINGREDUCE_DEADLOCK_TIME", cls.deadlock_seconds, float, minimum=0),
            stall_stacks=bool(_switch(environ, "RINGREDUCE_STALL_STACKS")),
            straggler_report=bool(_switch(environ, "RINGREDUCE_STRAGGLER_REPORT")),
            program_order=_switch(environ, "RINGREDUCE_PROGRAM_ORDER") is not False,
            calibrate=bool(_switch(environ, "RINGREDUCE_CALIBRATE")),
        )


def _number(environ, name, default, kind, minimum):
    text = environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value < minimum or value != value:  # value != value: NaN
        what = "whole number" if kind is int else "number"
        raise ValueError(f"{name}={text!r} must be a {what} of at least {minimum}")
    return value


def _switch(environ, name):
    """True, False, or None when the variable is unset or empty."""
    text = environ.get(name, "").strip().lower()
    if not text:
        return None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={environ[name]!r} must be 1 or 0 (or true/false, yes/no, on/off)")
