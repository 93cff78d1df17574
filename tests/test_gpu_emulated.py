"""The GPU path end to end on machines without a GPU: tests/workers/gpu.py (every collective on
CuPy arrays) under the real rrun and MPI, with the emulated CuPy of tests/emulated_cupy on the
job's PYTHONPATH. Device tagging, the device executor and the staging transport (chunks, copies,
the host algorithms underneath) run for real; CUDA itself is tested by test_gpu.py on a GPU."""

import os

import gpu_cases
import numpy as np
import pytest

from launch import run_job

pytestmark = pytest.mark.mpi

EMULATED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "emulated_cupy")


def emulated(**variables):
    path = os.pathsep.join(p for p in (EMULATED, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, **variables}


@pytest.mark.parametrize("ranks, chunk_bytes", [(1, None), (2, None), (2, "1024"), (3, "1024")])
def test_every_collective_on_emulated_cupy_arrays(tmp_path, ranks, chunk_bytes):
    """Chunks of 1 KiB split the 4 KiB arrays, so the staged allreduce pipelines several."""
    env = emulated(**({"RINGREDUCE_PIPELINE_CHUNK_BYTES": chunk_bytes} if chunk_bytes else {}))
    job = run_job(ranks, "gpu.py", tmp_path, env=env, timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(ranks):
        got = np.load(tmp_path / f"rank{rank}.npz")
        assert str(got["transport"]) == "staged"  # no NVIDIA device here: neither NCCL nor CUDA-aware MPI
        gpu_cases.check(got, rank, ranks)


def test_numpy_on_one_rank_and_emulated_cupy_on_the_other_is_named_on_both(tmp_path):
    gpu_cases.check_mismatch(run_job(2, "gpu.py", tmp_path, "mismatch", env=emulated(), timeout=120))


def test_asking_for_nccl_where_no_rank_has_it_fails_at_init(tmp_path):
    job = run_job(2, "gpu.py", tmp_path, env=emulated(RINGREDUCE_GPU_TRANSPORT="nccl"), timeout=120)
    assert job.returncode != 0
    assert "RINGREDUCE_GPU_TRANSPORT=nccl but NCCL is not available on every rank" in job.stderr
