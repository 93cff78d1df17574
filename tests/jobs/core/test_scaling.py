"""Scaled allreduces agree with Horovod's bit for bit: Horovod scales float16 and float32 in
float32 (the factor rounded to float32) and float64 and integers in float64, truncating integer
results, and averages by one multiplication by postscale / size. The reference here does the same
with numpy, from the values every rank contributed. At 1 and 2 ranks the sum is the same in any
order, so the comparison is exact (at 3 it would depend on the order MPI's own algorithm adds in)."""

import numpy as np
import pytest

from launch import run_job

PRESCALE, POSTSCALE = 0.1, 3.7


def horovod_scaled(values, factor):
    """values * factor as Horovod's CPU scaling computes it."""
    single = values.dtype.kind == "f" and values.dtype.itemsize <= 4
    wide = values.astype(np.float32 if single else np.float64) * (np.float32(factor) if single else factor)
    return np.trunc(wide).astype(values.dtype) if values.dtype.kind in "iu" else wide.astype(values.dtype)


@pytest.mark.parametrize("np_", [1, 2])
def test_prescale_postscale_and_average_give_horovods_bits(np_, tmp_path):
    job = run_job(np_, "core/scaling.py", tmp_path, timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    for dtype in ("float16", "float32", "float64", "int32", "uint16"):
        for count in (7, 40000):
            contributions = [np.random.default_rng([r, count]).uniform(0, 1000, count).astype(dtype)
                             for r in range(np_)]
            prescaled = [horovod_scaled(c, PRESCALE) for c in contributions]
            expected_sum = horovod_scaled(sum(prescaled[1:], prescaled[0]), POSTSCALE)
            expected_average = horovod_scaled(sum(contributions[1:], contributions[0]), POSTSCALE / np_)
            for rank in range(np_):
                got = np.load(tmp_path / f"rank{rank}.npz")
                np.testing.assert_array_equal(got[f"{dtype}-{count}-sum"], expected_sum, err_msg=f"{dtype} {count}")
                if dtype.startswith("float"):
                    np.testing.assert_array_equal(got[f"{dtype}-{count}-average"], expected_average,
                                                  err_msg=f"{dtype} {count} average")
