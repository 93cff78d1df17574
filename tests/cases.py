"""The inputs of the multi-process tests: the workers compute with them, the tests compute
the numpy reference from them, so both sides see the same arrays for every rank."""

import numpy as np

DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64")
OPS = ("Sum", "Average", "Min", "Max", "Product")
BOOL_OPS = ("Min", "Max", "Product")


def lengths(size):
    """0, 1, fewer elements than ranks, lengths that do not divide, and one that needs pieces."""
    return sorted({0, 1, max(size - 1, 0), 7, 1001, 50_003})


def allreduce_cases(size):
    for dtype in DTYPES:
        for op in BOOL_OPS if dtype == "bool" else OPS:
            for length in lengths(size):
                yield f"allreduce-{dtype}-{op}-{length}", dtype, op, length


def values(rank, dtype, length, salt=0):
    """Small whole numbers (bools for bool), so every sum and product is exact in any order
    of reduction and the comparison with numpy can be exact, to the last element."""
    rng = np.random.default_rng(1_000_003 * rank + 7919 * length + salt)
    if dtype == "bool":
        return rng.random(length) < 0.7
    low = 0 if dtype.startswith("uint") else -3
    return rng.integers(low, 4, size=length).astype(dtype)


def normal(rank, dtype, length):
    """Random reals, for checking that arbitrary values come out close to numpy's."""
    return np.random.default_rng([rank, length]).standard_normal(length).astype(dtype)


def reference_reduce(arrays, op):
    """The reduction as numpy computes it, in the arrays' own dtype."""
    stacked = np.stack(arrays)
    dtype = stacked.dtype
    if op in ("Sum", "Average"):
        total = np.add.reduce(stacked, axis=0, dtype=dtype)
        return total if op == "Sum" else average(total, len(arrays))
    ufunc = {"Min": np.minimum, "Max": np.maximum, "Product": np.multiply}[op]
    return ufunc.reduce(stacked, axis=0, dtype=dtype)


def average(total, size):
    """Average from the sum, as ringreduce (and for floats, Horovod) computes it: integers floored,
    floats multiplied by 1 / size once, float16 and float32 in float32."""
    if np.issubdtype(total.dtype, np.integer):
        return total // size
    single = total.dtype.itemsize <= 4
    wide = total.astype(np.float32) * np.float32(1 / size) if single else total * (1 / size)
    return wide.astype(total.dtype)


# A fused group as a training step submits it: several lengths, averaged together, most in place.
FUSED_LENGTHS = (1, 7, 1001, 50_003, 3, 20_000)


def fused_input(rank, index):
    return values(rank, "int64", FUSED_LENGTHS[index], salt=index)


def stress_specs(count=300):
    """(name, dtype, shape, op) of many tensors of mixed sizes and dtypes, the same on every rank."""
    rng = np.random.default_rng(2024)
    specs = []
    for index in range(count):
        dtype = str(rng.choice([d for d in DTYPES if d != "bool"]))
        shape = tuple(int(d) for d in rng.integers(1, 6, size=rng.integers(1, 4)))
        if index % 50 == 0:
            shape = (int(rng.integers(20_000, 60_000)),)  # a few large ones among the small
        op = str(rng.choice(OPS))
        specs.append((f"stress.{index}", dtype, shape, op))
    return specs


def stress_input(rank, index, dtype, shape):
    length = int(np.prod(shape))
    return values(rank, dtype, length, salt=index).reshape(shape)
