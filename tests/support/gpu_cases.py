"""What tests/jobs/gpu/gpu.py must have computed, checked against numpy: shared by the tests on a
real GPU (test_gpu.py) and on the emulated CuPy (test_gpu_emulated.py)."""

import importlib.util

import numpy as np
from ml_dtypes import bfloat16

from ringreduce.errors import ranks_text
from ringreduce.machine.layout import even_counts, offsets_of

import cases


def cuda_torch():
    """torch, where it has a GPU to test on; else None. Under the emulated CuPy torch is not even
    imported (1.5 s a rank): the emulator's GPUs are not torch's."""
    import cupy

    if cupy.__version__ == "emulated" or importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch if torch.cuda.is_available() else None


def check(got, rank, size):
    """Every result of tests/jobs/gpu/gpu.py on `rank` of `size`, against numpy."""
    for dtype in ("float32", "float64", "int64", "int16", "uint8"):
        expected = cases.reference_reduce([cases.values(r, dtype, 1001) for r in range(size)], "Sum")
        np.testing.assert_array_equal(got[f"allreduce-{dtype}"], expected)
    exact = [cases.values(r, "float32", 1001) for r in range(size)]
    np.testing.assert_allclose(got["allreduce-average"], np.mean(exact, axis=0), rtol=1e-6)
    np.testing.assert_allclose(got["allreduce-scaled"], np.sum(exact, axis=0) * 1.5, rtol=1e-6)
    normal = np.sum([cases.normal(r, "float32", 1001) for r in range(size)], axis=0)
    np.testing.assert_allclose(got["allreduce-fp16"], normal, rtol=2e-3, atol=4e-3)
    np.testing.assert_allclose(got["allreduce-bf16"], normal, rtol=2e-2, atol=3e-2)
    check_bfloat16(got, rank, size)
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
    for key in ("alltoall", "alltoall-async"):
        np.testing.assert_array_equal(got[key], np.repeat(np.arange(size), 2 * 2).reshape(2 * size, 2))
    matrices = [low_rank_matrix(r) for r in range(size)]
    np.testing.assert_allclose(got["powersgd-w"], np.mean(matrices, axis=0), rtol=1e-4, atol=1e-4)
    vectors = [cases.values(r, "float32", 10) for r in range(size)]
    np.testing.assert_allclose(got["powersgd-b"], np.mean(vectors, axis=0), rtol=1e-6)
    if "torch-allreduce" in got:
        np.testing.assert_array_equal(got["torch-allreduce"],
                                      np.sum([cases.values(r, "float32", 100) for r in range(size)], axis=0))
        np.testing.assert_array_equal(got["torch-bfloat16"],
                                      np.sum([cases.values(r, "float32", 100) for r in range(size)], axis=0))
        travels_as = "bfloat16" if bool(got["torch-bfloat16-carried"]) else "float32"
        assert str(got["torch-bfloat16-travels-as"]) == travels_as, got["torch-bfloat16-travels-as"]
        np.testing.assert_array_equal(got["torch-broadcast"], np.zeros((3, 4), np.float32))


def check_bfloat16(got, rank, size):
    """bfloat16 arrays came back as bfloat16 (the job saved their bits), exact (small whole numbers;
    the average rounded once, from float64, as the device's scaled cast does), and through NCCL as
    ncclBfloat16 where the emulated NCCL says so."""
    def bits(values):
        return np.asarray(values).astype(bfloat16).view(np.uint16)

    exact = [cases.values(r, "float32", 1001) for r in range(size)]
    np.testing.assert_array_equal(got["bfloat16-sum"], bits(np.sum(exact, axis=0)))
    average = np.sum(exact, axis=0).astype(np.float64) * (1.0 / size)
    np.testing.assert_array_equal(got["bfloat16-average"], bits(average))
    np.testing.assert_array_equal(got["bfloat16-allgather"],
                                  bits(np.concatenate([cases.values(r, "float32", 6) for r in range(size)])))
    np.testing.assert_array_equal(got["bfloat16-broadcast"], bits(cases.values(size - 1, "float32", 9)))
    total = np.sum([cases.values(r, "float32", 15).reshape(5, 3) for r in range(size)], axis=0)
    first = offsets_of(even_counts(5, size))
    np.testing.assert_array_equal(got["bfloat16-reducescatter"], bits(total[first[rank]:first[rank + 1]]))
    if rank == 1:
        np.testing.assert_array_equal(got["bfloat16-recv"], bits(cases.values(0, "float32", 7)))
    if "nccl-bfloat16" in got and str(got["transport"]) == "nccl":
        assert bool(got["nccl-bfloat16"]), "bfloat16 did not reach NCCL as ncclBfloat16"
    refused = str(got["host-bfloat16-refused"])  # the same error, naming every rank, raised on each
    assert f"failed on {ranks_text(list(range(size)))}: bfloat16 travels only as GPU" in refused, refused


def low_rank_matrix(rank):
    """Rank `rank`'s 32 x 24 gradient for PowerSGD: the same rank-2 column space on every rank, so
    their mean has rank 2 and PowerSGD at rank 2 is exact."""
    shared = np.random.default_rng(7).standard_normal((32, 2)).astype(np.float32)
    return shared @ np.random.default_rng(100 + rank).standard_normal((2, 24)).astype(np.float32)


def check_mismatch(job):
    """tests/jobs/gpu/gpu.py with "mismatch": numpy on rank 0, CuPy on rank 1, the same error on both."""
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(2):
        assert ("caught: allreduce 'mixed' does not match across ranks: array device cpu on rank 0 but cuda on "
                "rank 1") in job.lines_of(rank)[-1]
