"""Property-based checks of the collectives' input handling, on every rank at once.

Rank 0 draws the examples with Hypothesis and sends each to the others, so that every rank makes
the same calls; rank r contributes the drawn values times (r + 1). Each call must give the numpy
reference or raise a clear error of the documented type. Usage: properties.py EXAMPLES."""

import os
import sys
import traceback

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import ringreduce as rr  # noqa: E402

import cases  # noqa: E402

rr.init()
rank, size = rr.rank(), rr.size()
SETTINGS = settings(max_examples=int(sys.argv[1]), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
SUPPORTED = ["bool", "uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64"]
UNSUPPORTED = ["complex64", "uint32", "uint64", "datetime64[s]"]


@st.composite
def inputs(draw, min_dims=0):
    """(dtype, small whole-number values, layout): a supported or unsupported dtype, any shape
    (empty ones too), and one of the layouts `build` makes."""
    dtype = np.dtype(draw(st.sampled_from(SUPPORTED + UNSUPPORTED)))
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=0, max_side=5))
    values = draw(hnp.arrays(np.int8, shape, elements=st.integers(-3, 3)))
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided", "read-only", "list", "scalar"]))
    return dtype, values, layout


def build(spec, r, layout=None):
    """Rank r's input: the values times (r + 1) (bools and datetimes unchanged) in the layout."""
    dtype, values, drawn_layout = spec
    layout = layout or drawn_layout
    array = values.astype(dtype) if dtype.kind in "bM" else (values * (r + 1)).astype(dtype)
    if layout == "transposed":
        return array.T
    if layout == "strided" and array.ndim:
        return np.repeat(array, 2, axis=0)[::2]
    if layout == "read-only":
        array.setflags(write=False)
    elif layout == "list" and dtype.kind in "bif" and dtype != np.float16:
        return array.tolist()
    elif layout == "scalar" and array.size and dtype.kind in "if":
        return array.reshape(-1)[0].item()
    return array


def every_rank(spec):
    """Every rank's input as a numpy array, for the reference."""
    return [np.asarray(build(spec, r)) for r in range(size)]


def on_every_rank(*strategies):
    """Rank 0 draws each example and broadcasts it; every rank runs the check with it, and the
    example fails where it fails on any rank, so that Hypothesis shrinks on what all of them saw.
    Why not let each rank draw: Hypothesis does not promise the same examples in two processes,
    even derandomized (in CI two ranks once drew different names), and ranks whose calls differ
    fail with a MismatchError or wait for each other."""
    def decorate(check):
        def outcome(example):
            try:
                check(*example)
            except Exception:
                return f"rank {rank}: {traceback.format_exc()}"
            return None

        def draw_on_rank_0():
            def drawn(example):
                rr.broadcast_object(example)
                failures = [text for text in rr.allgather_object(outcome(example)) if text]
                assert not failures, "\n".join(failures)
            drawn.__name__ = check.__name__  # what Hypothesis's report of a falsifying example names
            try:
                SETTINGS(given(st.tuples(*strategies))(drawn))()
            finally:
                rr.broadcast_object(None)  # the end of the examples

        def follow_rank_0():
            while (example := rr.broadcast_object(None)) is not None:
                rr.allgather_object(outcome(example))

        runner = draw_on_rank_0 if rank == 0 else follow_rank_0
        runner.__name__ = check.__name__
        return runner
    return decorate


@on_every_rank(inputs(), st.sampled_from(["Sum", "Max", "Min", "Product", "Average"]))
def allreduce_matches_numpy_or_fails_clearly(spec, op):
    array = np.asarray(build(spec, rank))
    try:
        result = rr.allreduce(build(spec, rank), op=getattr(rr, op))
    except rr.UnsupportedDtypeError as error:
        assert array.dtype.name not in SUPPORTED or (array.dtype == np.bool_ and op in ("Sum", "Average")), error
        return
    assert array.dtype.name in SUPPORTED, f"{array.dtype} was accepted"
    every = np.stack(every_rank(spec))
    if op in ("Sum", "Average"):
        want = np.add.reduce(every, axis=0, dtype=array.dtype)
        if op == "Average":
            want = cases.average(want, size)
    else:
        want = {"Max": np.maximum, "Min": np.minimum, "Product": np.multiply}[op].reduce(every, axis=0,
                                                                                          dtype=array.dtype)
    assert result.dtype == array.dtype and result.shape == array.shape, (result.dtype, result.shape)
    np.testing.assert_array_equal(result, want)


@on_every_rank(inputs(), st.integers(-1, size))
def gathers_and_broadcasts_match_numpy_or_fail_clearly(spec, root):
    array = np.asarray(build(spec, rank))
    supported = array.dtype.name in SUPPORTED
    try:
        gathered = rr.allgather(build(spec, rank))
        assert supported and array.ndim >= 1
        np.testing.assert_array_equal(gathered, np.concatenate(every_rank(spec)))
    except rr.UnsupportedDtypeError:
        assert not supported
    except ValueError as error:
        assert array.ndim == 0 and "at least one dimension" in str(error), error
    try:
        result = rr.broadcast(build(spec, rank), root_rank=root)
        assert supported and 0 <= root < size
        np.testing.assert_array_equal(result, every_rank(spec)[root])
        assert result.shape == array.shape
    except rr.UnsupportedDtypeError:
        assert not supported
    except ValueError as error:
        assert not 0 <= root < size and f"root_rank {root} is not a rank of this job" in str(error), error


@on_every_rank(st.text(min_size=1, max_size=30))
def any_name_works(name):
    np.testing.assert_array_equal(rr.allreduce(np.ones(2) * (rank + 1), op=rr.Sum, name=name),
                                  np.full(2, size * (size + 1) / 2))


for check in (allreduce_matches_numpy_or_fails_clearly, gathers_and_broadcasts_match_numpy_or_fail_clearly,
              any_name_works):
    check()
    print(f"passed {check.__name__}", flush=True)
