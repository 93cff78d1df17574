"""CuPy arrays through the collectives (staged through host buffers, cast on the GPU). Skips
where CuPy is not installed or has no usable GPU, as on the CPU test machines."""

import numpy as np
import pytest

import cases
from launch import run_job

pytestmark = pytest.mark.mpi


def _usable_cupy():
    try:
        import cupy

        cupy.zeros(1).sum().get()
    except Exception as error:  # ImportError, or CUDA failing on first use without a driver
        pytest.skip(f"no usable CuPy/GPU here: {type(error).__name__}: {error}")


def test_collectives_on_cupy_arrays(tmp_path):
    _usable_cupy()
    job = run_job(2, "gpu.py", tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(2):
        got = np.load(tmp_path / f"rank{rank}.npz")
        for dtype in ("float32", "int64"):
            expected = cases.reference_reduce([cases.values(r, dtype, 1001) for r in range(2)], "Sum")
            np.testing.assert_array_equal(got[f"allreduce-{dtype}"], expected)
        fp16 = np.sum([cases.normal(r, "float32", 1001) for r in range(2)], axis=0)
        np.testing.assert_allclose(got["allreduce-fp16"], fp16, rtol=2e-3, atol=4e-3)
        np.testing.assert_array_equal(
            got["allreduce_-max"], cases.reference_reduce([cases.values(r, "float64", 33) for r in range(2)], "Max"))
        gathered = [cases.values(r, "int32", 2 * (r + 1)).reshape(r + 1, 2) for r in range(2)]
        np.testing.assert_array_equal(got["allgather"], np.concatenate(gathered))
        np.testing.assert_array_equal(got["broadcast_"], cases.values(0, "float32", 10))
