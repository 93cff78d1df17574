"""The kernels ringreduce.torch lends the core for the wire's narrow floats (ringreduce/numerics/kernels.py):
bit for bit numpy's (and ml_dtypes') results on values chosen to round every way (ties, overflow,
subnormals, infinities, NaN), on every layout, and numpy's own where they do not take the arrays."""

import warnings

import numpy as np
import pytest

from ringreduce import ops
from ringreduce.numerics import kernels, reduction
from ringreduce.numerics.compression import bfloat16

torch = pytest.importorskip("torch")
from ringreduce.torch.kernels import TorchKernels  # noqa: E402

NARROW = ["float16", "bfloat16"]


def dtype_of(name):
    return bfloat16() if name == "bfloat16" else np.dtype(name)


def float32_values():
    """Ties between neighbours of both narrow floats, their largest values and just beyond, their
    subnormals, float32's own extremes, infinities, NaN, signed zeros, and normals at every scale."""
    special = [0.0, -0.0, 1.0, -1.0, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8,
               65504.0, 65519.0, 65520.0, -65520.0, 1e5, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 1e-45, 1e-40,
               3.4028235e38, -3.4028235e38, 3.3961e38, np.inf, -np.inf, np.nan]
    rng = np.random.default_rng(0)
    scaled = rng.standard_normal(4000) * 10.0 ** rng.integers(-9, 6, 4000)
    return np.concatenate([special, scaled]).astype(np.float32)


def assert_same_bits(got, want):
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got.view(np.uint16 if got.itemsize == 2 else np.uint32)[~nan],
                                  want.view(np.uint16 if want.itemsize == 2 else np.uint32)[~nan])


@pytest.fixture(autouse=True)
def quiet():
    """numpy warns of the overflows and NaN these values make on purpose."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@pytest.fixture
def lent():
    kernels.lend(TorchKernels())
    yield
    kernels.lend(None)


@pytest.mark.parametrize("narrow", NARROW)
def test_casts_to_and_from_a_narrow_float_are_numpys_bit_for_bit(narrow, lent):
    values = float32_values()
    wire = np.empty(values.shape, dtype_of(narrow))
    kernels.cast_into(wire, values)
    assert_same_bits(wire, values.astype(dtype_of(narrow)))
    back = np.empty(values.shape, np.float32)
    kernels.cast_into(back, wire)
    assert_same_bits(back, wire.astype(np.float32))


@pytest.mark.parametrize("narrow", NARROW)
@pytest.mark.parametrize("op", [ops.Sum, ops.Average, ops.Product, ops.Min, ops.Max])
def test_a_narrow_floats_ops_are_numpys_bit_for_bit(narrow, op, lent):
    """Sum, Average and Product lent; Min and Max numpy's (torch's differ on signed zeros)."""
    values = float32_values().astype(dtype_of(narrow))
    others = np.roll(values, 7)
    combine = reduction.ufunc(op, values.dtype)
    assert (combine is reduction.ufunc(op)) == (op in (ops.Min, ops.Max))
    want = reduction.ufunc(op)(values, others)
    assert_same_bits(combine(values, others), want)
    into = values.copy()
    assert combine(into, others, out=into) is into
    assert_same_bits(into, want)


def test_what_torch_cannot_view_goes_to_numpy(lent):
    """Read-only, reversed, transposed and strided arrays, float64 (torch would round it through
    float32) and shapes that broadcast: the same results as numpy's."""
    values = float32_values()[:64].reshape(8, 8)
    read_only = values.copy()
    read_only.setflags(write=False)
    for source in (read_only, values[::-1], values.T, values[:, ::2], values.astype(np.float64)):
        wire = np.empty(source.shape, np.float16)
        kernels.cast_into(wire, source)
        assert_same_bits(wire, source.astype(np.float16))
    wide = np.empty((8, 8), np.float16)
    kernels.cast_into(wide, values[0].astype(np.float32))
    assert_same_bits(wide, np.broadcast_to(values[0], (8, 8)).astype(np.float16))
    halves = values.astype(np.float16)
    combine = reduction.ufunc(ops.Sum, np.float16)
    assert_same_bits(combine(halves[::-1], halves), halves[::-1] + halves)


def test_without_a_lender_the_core_uses_numpy():
    kernels.lend(None)
    assert reduction.ufunc(ops.Sum, np.float16) is np.add
    assert reduction.ufunc(ops.Sum, np.float32) is np.add
