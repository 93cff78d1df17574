"""CuPy arrays and CUDA torch tensors through every collective, on the GPU, under each device
transport, at 1 and 2 ranks (2 ranks share one GPU where there is only one). Skips where CuPy
has no usable GPU, as on the CPU test machines; benchmarks/gpu_check.sh runs it on a GPU."""

import os

import gpu_cases
import numpy as np
import pytest

from ringreduce.machine import gpu

from launch import run_job


def _gpus():
    cupy = gpu.cupy_or_none()
    if cupy is None:
        pytest.skip(f"no usable GPU here: {gpu.unavailable_reason()}")
    return cupy.cuda.runtime.getDeviceCount()


def _transports(ranks):
    """The transports that can run at `ranks` ranks on this machine (NCCL needs a GPU per rank)."""
    count = _gpus()
    names = ["auto", "staged"]
    if gpu.nccl_module() is not None and count >= ranks:
        names.append("nccl")
    if gpu.mpi_takes_device_buffers():
        names.append("mpi")
    return names


@pytest.mark.parametrize("ranks, transport", [(1, "auto"), (1, "nccl"), (1, "staged"), (2, "auto"), (2, "staged"),
                                              (2, "nccl"), (2, "mpi")])
def test_collectives_on_the_gpu(tmp_path, ranks, transport):
    if transport not in _transports(ranks):
        pytest.skip(f"{transport} cannot run at {ranks} ranks here")
    job = run_job(ranks, "gpu/gpu.py", tmp_path, env={"RINGREDUCE_GPU_TRANSPORT": transport}, timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    count = _gpus()
    for rank in range(ranks):
        got = np.load(tmp_path / f"rank{rank}.npz")
        assert int(got["device"]) == rank % count  # init gave each local rank its own GPU, in turn
        if transport != "auto":
            assert str(got["transport"]) == transport
        gpu_cases.check(got, rank, ranks)


@pytest.mark.parametrize("ranks, transport", [(1, "auto"), (2, "auto"), (2, "staged"), (1, "nccl")])
def test_work_the_caller_queued_is_waited_for_and_results_are_not_overwritten_while_read(ranks, transport):
    """tests/jobs/gpu/streams.py: inputs made by long kernel chains on side CuPy and torch streams,
    an alltoall from a side stream, and results freed while a kernel still reads them."""
    if transport not in _transports(ranks):
        pytest.skip(f"{transport} cannot run at {ranks} ranks here")
    side = os.environ.get("RINGREDUCE_TEST_STREAMS_SIDE", "1024")  # gpu_check.sh --dry-run: small
    job = run_job(ranks, "gpu/streams.py", side, env={"RINGREDUCE_GPU_TRANSPORT": transport}, timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    assert all(job.lines_of(rank) == [f"rank {rank}: every stream case exact"] for rank in range(ranks)), job.stdout


def test_numpy_on_one_rank_and_cupy_on_the_other_is_named_on_both(tmp_path):
    _gpus()
    gpu_cases.check_mismatch(run_job(2, "gpu/gpu.py", tmp_path, "mismatch", timeout=120))


def test_nccl_asked_for_with_two_ranks_on_one_gpu_is_refused_at_init(tmp_path):
    if _gpus() != 1 or gpu.nccl_module() is None:
        pytest.skip("needs exactly one GPU and NCCL")
    job = run_job(2, "gpu/gpu.py", tmp_path, env={"RINGREDUCE_GPU_TRANSPORT": "nccl"}, timeout=120)
    assert job.returncode != 0
    assert "RINGREDUCE_GPU_TRANSPORT=nccl but NCCL is not available on every rank" in job.stderr
