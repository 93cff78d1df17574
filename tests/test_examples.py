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
