"""The examples a user copies from run under rrun and reach what they promise."""

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")

pytestmark = pytest.mark.mpi


def test_numpy_example_trains_the_same_model_on_every_rank():
    result = subprocess.run(
        [sys.executable, "-m", "ringreduce.launcher", "-np", "2", sys.executable,
         os.path.join(EXAMPLES, "numpy_allreduce.py")],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("[0]<stdout>:trained on 8192 samples by 2 ranks")
    assert last.endswith("models identical on all ranks")


def test_synthetic_benchmark_sums_the_ranks_rates():
    result = subprocess.run(
        [sys.executable, "-m", "ringreduce.launcher", "-np", "2", sys.executable,
         os.path.join(EXAMPLES, "pytorch_synthetic_benchmark.py"), "--num-iters", "2", "--num-batches-per-iter", "2",
         "--num-warmup-batches", "1", "--no-cuda"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    lines = [line.split(":", 1)[1] for line in result.stdout.splitlines() if line.startswith("[0]<stdout>:")]
    per_rank = float(lines[-2].split()[3])
    total = float(lines[-1].rsplit(":", 1)[1])
    assert lines[-1].startswith("total img/sec on 2 rank(s) (cpu): ")
    assert per_rank > 0 and total > per_rank  # the other rank's rate is in the sum
