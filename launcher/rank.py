"""The process mpiexec starts for each rank: it runs the user's command, puts the rank in
front of every line it prints, and reports to rrun how the command ended.

Doing this here rather than with each MPI's own output flags gives every MPI the same
format, keeps stdout and stderr apart, and tells rrun the exit code or signal of each rank
(mpiexec only says that something failed). This process must not start MPI itself: its
child inherits the launcher's connection.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading

from ringreduce.launcher.protocol import (
    MAX_OUTPUT_LINE,
    SECRET_VARIABLE,
    WORLD_SIZE_VARIABLE,
    parse_status,
    status_line,
)
from ringreduce.launcher.torchrun import rank_environment
from ringreduce.machine import gpu_placement

# Where each MPI and Slurm put the rank of the process they start.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
# SIGUSR1 is the preemption notice a job script passes on (ringreduce.stop_requested()).
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
REPORT_BINDINGS_VARIABLE = "RRUN_REPORT_BINDINGS"
BIND_TO_GPU_VARIABLE = "RRUN_BIND_TO_GPU"
# Where Open MPI and MPICH's Hydra put the number of ranks on this host (torchrun's, from rrun's placement, under srun).
LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    world_size, command = argv[0], argv[2:]  # <world size> -- <command...>
    rank = next((os.environ[v] for v in RANK_VARIABLES if v in os.environ), "?")
    env = dict(os.environ, **{WORLD_SIZE_VARIABLE: world_size})
    env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the terminal as they are printed
    if rank.isdigit():
        for name, value in rank_environment(env, int(world_size), int(rank)).items():
            env.setdefault(name, value)
    near = bind_to_gpu(env) if env.pop(BIND_TO_GPU_VARIABLE, None) else ""
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(env)))  # of the CPUs it is bound to by now
    if env.pop(REPORT_BINDINGS_VARIABLE, None):
        cpus = sorted(os.sched_getaffinity(0))  # what mpiexec (or --bind-to gpu) bound this process, and the rank, to
        sys.stderr.write(f"rrun: rank {rank} on {socket.gethostname()} is bound to CPUs {_ranges(cpus)}{near}\n")
        sys.stderr.flush()
    try:
        child = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, close_fds=False, preexec_fn=_die_with_parent,
        )
    except OSError as error:
        _report(rank, 127, None, f"cannot start {command[0]!r}: {error.strerror}")
        return 127

    stopped_by = []

    def forward(signum, _frame):
        stopped_by.append(signal.Signals(signum).name)
        child.send_signal(signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    last_error = []
    relays = [
        threading.Thread(target=_relay, args=(child.stdout, sys.stdout.buffer, f"[{rank}]<stdout>:", None)),
        threading.Thread(target=_relay, args=(child.stderr, sys.stderr.buffer, f"[{rank}]<stderr>:", last_error)),
    ]
    for relay in relays:
        relay.start()
    code = child.wait()
    for relay in relays:
        relay.join()
    _report(rank, code, stopped_by[0] if stopped_by else None, last_error[-1] if last_error else None)
    return code if code >= 0 else 128 - code


def wrapped(world_size, command):
    """What mpiexec starts for each rank: this wrapper around the user's `command`."""
    return [sys.executable, "-m", "ringreduce.launcher.rank", str(world_size), "--", *command]


def bind_to_gpu(env, sysfs="/sys"):
    """`rrun --bind-to gpu`: bind this process (and so the rank) to the CPUs near the GPU it will
    drive, shared with the host's other ranks near that GPU's CPUs (gpu_placement.cpus_for_gpu), and
    number GPUs as sysfs does (CUDA_DEVICE_ORDER=PCI_BUS_ID). What --report-bindings adds."""
    local_rank, local_size = int(env.get("LOCAL_RANK", 0)), int(env.get("LOCAL_WORLD_SIZE", 1))
    shown = gpu_placement.visible(gpu_placement.host_gpus(sysfs), env.get("CUDA_VISIBLE_DEVICES"))
    if not shown:
        why = "CUDA_VISIBLE_DEVICES names GPUs by UUID" if shown is None else "no NVIDIA GPU in sysfs or nvidia-smi"
        return f" (--bind-to gpu: {why}, so left as mpiexec placed it)"
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    chosen = gpu_placement.cpus_for_gpu(local_rank, local_size, [near for _, near in shown],
                                        frozenset(os.sched_getaffinity(0)))
    if chosen is None:
        return f" (--bind-to gpu: the CPUs near GPU {local_rank % len(shown)} are unknown, so left unbound)"
    gpu, cpus = chosen
    os.sched_setaffinity(0, cpus)
    return f", near GPU {gpu} ({shown[gpu][0]})"


def threads_per_rank(environ, mine=None, node=None):
    """The threads a rank's OpenMP and BLAS pools (torch's, numpy's OpenBLAS) should start: the CPUs
    it may run on (`mine`, its affinity), divided among the host's ranks that share them. More
    threads than cores is worse than slow: idle pool threads spin, taking the cores the other ranks
    compute on (PowerSGD's products at 2 ranks on 2 cores: 59 ms, 15 ms with one thread each).

    Slurm's SLURM_CPUS_PER_TASK is the answer where it is set. Otherwise the ranks that share this
    rank's CPUs are counted from the CPUs of the whole job on this host (`node`: those of the MPI
    daemon that started the rank, which runs in the job's cgroup and is not bound): unbound, all
    the host's ranks share them; bound to a NUMA domain, the ranks of that domain do."""
    mine = set(os.sched_getaffinity(0)) if mine is None else set(mine)
    node = _daemon_cpus() if node is None else set(node)
    if environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(1, min(int(environ["SLURM_CPUS_PER_TASK"]), len(mine)))
    local = next((int(environ[v]) for v in LOCAL_SIZE_VARIABLES if environ.get(v, "").isdigit()), 1)
    sharing = max(1, round(local * len(mine) / max(len(node | mine), 1)))
    return max(1, len(mine) // sharing)


def _daemon_cpus():
    """The CPUs of the process that started this wrapper (the MPI's daemon), else this host's."""
    try:
        return set(os.sched_getaffinity(os.getppid()))
    except OSError:
        return set(range(os.cpu_count() or 1))


def _ranges(numbers):
    """[0, 1, 2, 5] -> '0-2,5'."""
    spans = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in spans)


def _relay(source, sink, prefix, last_line):
    """Copy lines from the child to our stream with the rank in front, remembering the last."""
    prefix = prefix.encode()
    for line in iter(lambda: source.readline(MAX_OUTPUT_LINE), b""):
        if parse_status(line, os.environ.get(SECRET_VARIABLE)) is not None:  # the rank's report, for rrun: as is
            sink.write(line)
            sink.flush()
            continue
        sink.write(prefix + (line if line.endswith(b"\n") else line + b"\n"))
        sink.flush()
        if last_line is not None and line.strip():
            last_line[:] = [line.decode(errors="replace").strip()[:300]]


def _report(rank, code, stopped_by, last_error):
    sys.stderr.buffer.write(status_line(rank, code, last_error, stopped_by))
    sys.stderr.flush()


def _die_with_parent():
    """In the child: be killed if this wrapper dies, so no rank outlives a killed job."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


if __name__ == "__main__":
    sys.exit(main())
