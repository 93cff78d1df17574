"""Every tuning knob in one place: Config holds each one's default, KNOBS its variable, how it is
read and checked, and rrun's flag for it with its help text, so that the core's settings and rrun's
flags come from one table and a job can be tuned either way. Names and defaults follow Horovod's
where Horovod has the same knob.
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
    # Each rank keeps its last this many collectives for rrun to show when the job fails, stalls or
    # is interrupted, or on `rrun --dump` (0: none).
    flight_recorder: int = 32
    # Plain calls on up to 8 ranks pair up in program order and run there where they can
    # (engine/plain_calls.py); off: through the engine, as every other call.
    program_order: bool = True
    # Every float sum and product adds the ranks' values in rank order, element by element, whatever
    # the family, fusion, piece size and arrival order: the same bits in every run.
    deterministic: bool = False

    @classmethod
    def from_env(cls, environ=os.environ):
        values = {knob.field: knob.read(environ, _default(knob.field)) for knob in KNOBS if knob.field}
        if values["hierarchical"] and values["algorithm"] not in ("auto", "shm"):
            raise ValueError(f"RINGREDUCE_HIERARCHICAL=1 needs RINGREDUCE_ALGORITHM auto or shm, not "
                             f"{values['algorithm']}")
        return cls(**values)


# Where a binding says a knob's default comes from when its variable is unset, read at init
# (ringreduce.torch: `deterministic` from torch.use_deterministic_algorithms).
_LENT_DEFAULTS: dict = {}


def lend_default(field: str, read) -> None:
    """Take Config field `field`'s default from `read()` at init, where its variable is unset."""
    _LENT_DEFAULTS[field] = read


def _default(field):
    return _LENT_DEFAULTS[field]() if field in _LENT_DEFAULTS else getattr(Config, field)


@dataclasses.dataclass(frozen=True)
class Knob:
    """One knob: the Config field it sets (None: read where it is used), its variable, how its
    value is read and checked, and rrun's flag for it, where there is one. The default is the
    Config field's; help texts show it (or `shown_default`, where the value alone says too little)."""

    field: str | None
    variable: str
    kind: str  # "choice", "int", "float", "switch" or "text"
    help: str = ""
    flag: str | None = None
    choices: tuple = ()
    minimum: float = 0
    flag_unit: int = 1  # how many of the variable's units a flag's unit is (MiB -> bytes)
    shown_default: str | None = None

    def read(self, environ, default):
        if self.kind == "choice":
            value = environ.get(self.variable, default).strip().lower()
            if value not in self.choices:
                raise ValueError(f"{self.variable}={value!r} is not one of {', '.join(self.choices)}")
            return value
        if self.kind in ("int", "float"):
            return _number(environ, self.variable, default, int if self.kind == "int" else float, self.minimum)
        if self.kind == "switch":
            value = _switch(environ, self.variable)
            return default if value is None else value
        return environ.get(self.variable) or default

    @property
    def default_text(self):
        if self.shown_default is not None:
            return self.shown_default
        default = getattr(Config, self.field) if self.field else None
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            return f"{default / self.flag_unit:g}"
        return str(default)


KNOBS = (
    Knob("algorithm", "RINGREDUCE_ALGORITHM", "choice", flag="--algorithm", choices=ALGORITHMS,
         help="Collective algorithms: chosen per collective, size and topology by the cost model, or one family "
              "for all: the ring, shared memory inside each host, the MPI library's own, recursive halving and "
              "doubling, the binomial tree."),
    Knob(None, "RINGREDUCE_PROFILE", "text", flag="--profile", shown_default="~/.cache/ringreduce/profile.json",
         help="The cost model's profile: where --calibrate saves it and jobs read it."),
    Knob("gpu_transport", "RINGREDUCE_GPU_TRANSPORT", "choice", flag="--gpu-transport", choices=GPU_TRANSPORTS,
         shown_default="auto, the first of these that every rank has",
         help="How collectives of GPU arrays travel: NCCL, CUDA-aware MPI or staging through pinned host memory."),
    Knob("hierarchical", "RINGREDUCE_HIERARCHICAL", "switch",
         flag="--hierarchical-allreduce/--no-hierarchical-allreduce",
         shown_default="when every host runs the same number of ranks, more than one",
         help="Across hosts, allreduce through shared memory inside each host and a ring across hosts."),
    Knob("fusion_threshold_bytes", "RINGREDUCE_FUSION_THRESHOLD", "int", flag="--fusion-threshold-mb",
         flag_unit=1 << 20, help="Fuse ready allreduces into buffers of up to this many MiB (0: no fusion)."),
    Knob("cycle_time_ms", "RINGREDUCE_CYCLE_TIME", "float", flag="--cycle-time-ms",
         help="Longest wait of a ready request for the engine's next cycle."),
    Knob("cache_capacity", "RINGREDUCE_CACHE_CAPACITY", "int", flag="--cache-capacity",
         help="Negotiated requests remembered, so repeats cost one bit (0: off)."),
    Knob("timeline", "RINGREDUCE_TIMELINE", "text", flag="--timeline-filename", shown_default="none",
         help="Write a Chrome trace of the engine's work (rank 0) to this file."),
    Knob("stall_check_seconds", "RINGREDUCE_STALL_CHECK_TIME", "float", flag="--stall-check-seconds",
         help="Warn when ranks wait this long for a request others have not submitted."),
    Knob("stall_shutdown_seconds", "RINGREDUCE_STALL_SHUTDOWN_TIME", "float", flag="--stall-shutdown-seconds",
         shown_default="never", help="End the job when such a stall lasts this long."),
    Knob("deadlock_seconds", "RINGREDUCE_DEADLOCK_TIME", "float", flag="--deadlock-seconds",
         help="Fail the requests of a deadlock (every rank blocked in a wait this long, with nothing new "
              "submitted anywhere, for requests others have not submitted) on every rank (0: never)."),
    Knob("stall_stacks", "RINGREDUCE_STALL_STACKS", "switch", flag="--stall-stacks",
         help="With a stall warning, every rank also prints its Python stacks."),
    Knob("deterministic", "RINGREDUCE_DETERMINISTIC", "switch", flag="--deterministic",
         help="Float sums and products add the ranks' values in rank order, the same bits whatever the "
              "algorithm, fusion and timing (on GPU arrays, through host memory)."),
    Knob("straggler_report", "RINGREDUCE_STRAGGLER_REPORT", "switch", flag="--straggler-report",
         help="At shutdown, rank 0 prints which ranks kept the others waiting."),
    Knob("flight_recorder", "RINGREDUCE_FLIGHT_RECORDER", "int", flag="--flight-recorder", minimum=0,
         help="Each rank keeps its last N collectives; rrun shows them when the job fails, stalls or is "
              "interrupted, on `rrun --dump` and on SIGUSR2, and writes them to a file it names (0: none)."),
    Knob("pipeline_chunk_bytes", "RINGREDUCE_PIPELINE_CHUNK_BYTES", "int", minimum=1),
    Knob("shared_memory_piece_bytes", "RINGREDUCE_SHM_PIECE_BYTES", "int", minimum=64),
    Knob("simulated_hosts", "RINGREDUCE_SIMULATED_HOSTS", "int", minimum=1),
    Knob("program_order", "RINGREDUCE_PROGRAM_ORDER", "switch"),
    Knob("calibrate", "RINGREDUCE_CALIBRATE", "switch"),
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
