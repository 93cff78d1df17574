"""CuPy arrays and CUDA torch tensors through every collective, on the GPU, under each device
transport, at 1 and 2 ranks (2 ranks share one GPU where there is only one). Skips where CuPy
has no usable GPU, as on the CPU test machines; benchmarks/gpu_check.sh runs it on a GPU."""

import numpy as np
import pytest

from ringreduce import gpu
from ringreduce.algorithms.ring import even_counts, offsets_of

import cases
from launch import run_job

pytestmark = pytest.mark.mpi


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
    job = run_job(ranks, "gpu.py", tmp_path, env={"RINGREDUCE_GPU_TRANSPORT": transport}, timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    count = _gpus()
    for rank in range(ranks):
        got = np.load(tmp_path / f"rank{rank}.npz")
        assert int(got["device"]) == rank % count  # init gave each local rank its own GPU, in turn
        if transport != "auto":
            assert str(got["transport"]) == transport
        _check(got, rank, ranks)


def _check(got, rank, size):
    for dtype in ("float32", "float64", "int64", "int16", "uint8"):
        expected = cases.reference_reduce([cases.values(r, dtype, 1001) for r in range(size)], "Sum")
        np.testing.assert_array_equal(got[f"allreduce-{dtype}"], expected)
    exact = [cases.values(r, "float32", 1001) for r in range(size)]
    np.testing.assert_allclose(got["allreduce-average"], np.mean(exact, axis=0), rtol=1e-6)
    np.testing.assert_allclose(got["allreduce-scaled"], np.sum(exact, axis=0) * 1.5, rtol=1e-6)
    normal = np.sum([cases.normal(r, "float32", 1001) for r in range(size)], axis=0)
    np.testing.assert_allclose(got["allreduce-fp16"], normal, rtol=2e-3, atol=4e-3)
    bools = [cases.values(r, "bool", 77) for r in range(size)]
    np.testing.assert_array_equal(got["allreduce-bool-max"], np.any(bools, axis=0))
    for i, n in enumerate((1, 1000, 33, 0, 4097)):
        expected = np.sum([cases.values(r, "float32", n, salt=i) for r in range(size)], axis=0)
        np.testing.assert_array_equal(got[f"grouped-{i}"], expected)
        mean = np.mean([cases.normal(r, "float32", n) for r in range(size)], axis=0)
        np.testing.assert_allclose(got[f"grouped-fp16-{i}"], mean, rtol=2e-3, atol=4e-3)
    maxima = np.max([cases.values(r, "float64", 33) for r in range(size)], axis=0)
    np.testing.assert_array_equal(got["allreduce_-max"], maxima)
    strided = np.sum([cases.values(r, "float32", 64).reshape(8, 8).T for r in range(size)], axis=0)
    np.testing.assert_array_equal(got["allreduce-strided"], strided)
    gathered = [cases.values(r, "int32", 2 * (r + 1)).reshape(r + 1, 2) for r in range(size)]
    np.testing.assert_array_equal(got["allgather"], np.concatenate(gathered))
    np.testing.assert_array_equal(got["broadcast"], cases.values(size - 1, "float32", 10))
    np.testing.assert_array_equal(got["broadcast_"], cases.values(0, "float32", 10))
    total = np.sum([cases.values(r, "float32", 15).reshape(5, 3) for r in range(size)], axis=0)
    first = offsets_of(even_counts(5, size))
    np.testing.assert_array_equal(got["reducescatter"], total[first[rank]:first[rank + 1]])
    np.testing.assert_array_equal(got["alltoall"], np.repeat(np.arange(size), 2 * 2).reshape(2 * size, 2))
    if "torch-allreduce" in got:
        np.testing.assert_array_equal(got["torch-allreduce"],
                                      np.sum([cases.values(r, "float32", 100) for r in range(size)], axis=0))
        np.testing.assert_array_equal(got["torch-broadcast"], np.zeros((3, 4), np.float32))


def test_numpy_on_one_rank_and_cupy_on_the_other_is_named_on_both(tmp_path):
    _gpus()
    job = run_job(2, "gpu.py", tmp_path, "mismatch", timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(2):
        assert ("caught: allreduce 'mixed' does not match across ranks: array device cpu on rank 0 but cuda on "
                "rank 1") in job.lines_of(rank)[-1]


def test_nccl_asked_for_with_two_ranks_on_one_gpu_is_refused_at_init(tmp_path):
    if _gpus() != 1 or gpu.nccl_module() is None:
        pytest.skip("needs exactly one GPU and NCCL")
    job = run_job(2, "gpu.py", tmp_path, env={"RINGREDUCE_GPU_TRANSPORT": "nccl"}, timeout=120)
    assert job.returncode != 0
    assert "RINGREDUCE_GPU_TRANSPORT=nccl but NCCL is not available on every rank" in job.stderr
