"""How the ranks' messages for one name are compared, and the error they all raise."""

import numpy as np
import pytest

from ringreduce import ops
from ringreduce.engine.agreement import Message, disagreement
from ringreduce.errors import MismatchError, UnsupportedDtypeError
from ringreduce.numerics import reduction


def msg(**fields):
    return Message(**{"name": "w", "kind": "allreduce", "dtype": "float32", "shape": (3,), "op": 1, **fields})


def test_identical_messages_agree():
    assert disagreement([msg(), msg(), msg()], [0, 1, 2]) is None


def test_allgather_may_differ_in_the_first_dimension_only():
    gather = dict(kind="allgather", op=-1)
    assert disagreement([msg(shape=(2, 3), **gather), msg(shape=(5, 3), **gather)], [0, 1]) is None
    error = disagreement([msg(shape=(2, 3), **gather), msg(shape=(2, 4), **gather)], [0, 1])
    assert "shape after the first dimension (3,) on rank 0 but (4,) on rank 1" in str(error)
    assert disagreement([msg(shape=(2,)), msg(shape=(5,))], [0, 1]) is not None


def test_explanations_name_ranks_and_values():
    error = disagreement([msg(), msg(dtype="float64", shape=(4,), op=4), msg()], [0, 1, 2])
    assert isinstance(error, MismatchError) and isinstance(error, ValueError)
    assert str(error) == ("allreduce 'w' does not match across ranks: shape (3,) on ranks 0, 2 but (4,) on "
                          "rank 1; dtype float32 on ranks 0, 2 but float64 on rank 1; op Sum on ranks 0, 2 "
                          "but Max on rank 1")


def test_scaling_and_compression_must_agree():
    error = disagreement([msg(prescale=0.5), msg(compression="fp16")], [0, 1])
    assert "prescale_factor 0.5 on rank 0 but 1.0 on rank 1" in str(error)
    assert "compression none on rank 0 but fp16 on rank 1" in str(error)


def test_numpy_on_one_rank_and_cupy_on_another_is_named():
    error = disagreement([msg(), msg(device="cuda"), msg(device="cuda")], [0, 1, 2])
    assert str(error) == "allreduce 'w' does not match across ranks: array device cpu on rank 0 but cuda on ranks 1, 2"


def test_different_collectives_for_one_name():
    error = disagreement([msg(), msg(kind="broadcast", root=0)], [0, 1])
    assert str(error) == "allreduce 'w' does not match across ranks: collective allreduce on rank 0 but " \
                         "broadcast on rank 1"


def test_problems_keep_their_type_and_group_ranks():
    problem = ("UnsupportedDtypeError", "dtype complex64 is not supported")
    error = disagreement([Message(name="w", kind="allreduce", problem=problem), msg()], [0, 1])
    assert isinstance(error, UnsupportedDtypeError) and isinstance(error, TypeError)
    assert str(error) == "allreduce 'w' failed on rank 0: dtype complex64 is not supported"
    both = disagreement([Message(name="w", kind="allreduce", problem=("ValueError", "a")),
                         Message(name="w", kind="allreduce", problem=("ValueError", "b"))], [0, 1])
    assert str(both) == "allreduce 'w' failed: a (on rank 0); b (on rank 1)"


@pytest.mark.parametrize("dtype, op, expected", [
    ("int32", ops.Average, [-3, 3]),        # the mean truncated toward zero, as Horovod's
    ("float32", ops.Average, [-3.5, 3.5]),
    ("float16", ops.Sum, [-7, 7]),
])
def test_finish_turns_sums_into_results(dtype, op, expected):
    array = np.array([-7, 7], dtype=dtype)
    reduction.scale_result(array, op, 2)
    np.testing.assert_array_equal(array, np.array(expected, dtype=dtype))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("op, postscale", [(ops.Average, 1.0), (ops.Average, 0.3), (ops.Sum, 1.0 / 3)])
def test_a_result_scaled_into_another_array_has_the_bits_of_one_scaled_in_place(dtype, op, postscale):
    """The reduce-scatter hands its result out of a work buffer in the pass that scales it."""
    sums = (np.random.default_rng(7).standard_normal(1000) * 1000).astype(dtype)
    in_place, out = sums.copy(), np.empty_like(sums)
    reduction.scale_result(in_place, op, 3, postscale)
    reduction.scale_result(sums, op, 3, postscale, out=out)
    np.testing.assert_array_equal(out.view(np.uint8), in_place.view(np.uint8))
    np.testing.assert_array_equal(sums, (np.random.default_rng(7).standard_normal(1000) * 1000).astype(dtype))


def test_bool_supports_only_logical_ops():
    for op in (ops.Min, ops.Max, ops.Product):
        reduction.check_op(op, np.dtype(bool))
    for op in (ops.Sum, ops.Average):
        with pytest.raises(UnsupportedDtypeError, match="not defined for bool"):
            reduction.check_op(op, np.dtype(bool))
    with pytest.raises(ValueError, match="unknown reduction op 'mean'"):
        ops.as_op("mean")
