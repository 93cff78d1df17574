"""The cross-rank check as pure logic: records, when they disagree, and the error it explains."""

import numpy as np
import pytest

from ringreduce import agreement, ops
from ringreduce.agreement import Description, Signature
from ringreduce.errors import MismatchError, UnsupportedDtypeError


def rows(*calls):
    return np.stack([agreement.record(kind, name, sig, None) for kind, name, sig in calls])


F32 = np.dtype("float32")


def test_identical_calls_agree():
    sig = Signature(F32, (3, 4), int(ops.Sum))
    assert not agreement.disagrees(rows(("allreduce", "g", sig), ("allreduce", "g", sig)))


def test_allgather_may_differ_in_the_first_dimension_only():
    a, b, c = Signature(F32, (2, 3)), Signature(F32, (5, 3)), Signature(F32, (2, 4))
    assert not agreement.disagrees(rows(("allgather", None, a), ("allgather", None, b)))
    assert agreement.disagrees(rows(("allgather", None, a), ("allgather", None, c)))
    assert agreement.disagrees(rows(("allreduce", None, a), ("allreduce", None, b)))


def test_a_problem_on_one_rank_is_a_disagreement():
    sig = Signature(F32, (3,))
    table = np.stack([agreement.record("allreduce", None, sig, None),
                      agreement.record("allreduce", None, None, TypeError("bad"))])
    assert agreement.disagrees(table)


def test_explanations_name_ranks_and_values():
    sig = Signature(F32, (3,), int(ops.Sum))
    other = Signature(np.dtype("float64"), (4,), int(ops.Max))
    error = agreement.explain([Description("allreduce", "w", sig, None),
                               Description("allreduce", "w", other, None),
                               Description("allreduce", "w", sig, None)])
    assert isinstance(error, MismatchError) and isinstance(error, ValueError)
    assert str(error) == ("allreduce 'w' does not match across ranks: dtype float32 on ranks 0, 2 but "
                          "float64 on rank 1; shape (3,) on ranks 0, 2 but (4,) on rank 1; "
                          "op Sum on ranks 0, 2 but Max on rank 1")


def test_problems_keep_their_type_and_group_ranks():
    problem = ("UnsupportedDtypeError", "dtype complex64 is not supported")
    error = agreement.explain([Description("allreduce", None, None, problem),
                               Description("allreduce", None, Signature(F32, (3,)), None)])
    assert isinstance(error, UnsupportedDtypeError) and isinstance(error, TypeError)
    assert str(error) == "allreduce failed on rank 0: dtype complex64 is not supported"


def test_too_many_dimensions_is_a_clear_error():
    with pytest.raises(ValueError, match="more than 32 dimensions"):
        Signature.of(np.zeros((1,) * 33))


@pytest.mark.parametrize("dtype, op, expected", [
    ("int32", ops.Average, [-4, 3]),        # floor of the mean, exact for any integer
    ("float32", ops.Average, [-3.5, 3.5]),
    ("float16", ops.Sum, [-7, 7]),
])
def test_finish_turns_sums_into_results(dtype, op, expected):
    array = np.array([-7, 7], dtype=dtype)
    ops.finish(array, op, 2)
    np.testing.assert_array_equal(array, np.array(expected, dtype=dtype))


def test_bool_supports_only_logical_ops():
    for op in (ops.Min, ops.Max, ops.Product):
        ops.check_op(op, np.dtype(bool))
    for op in (ops.Sum, ops.Average):
        with pytest.raises(UnsupportedDtypeError, match="not defined for bool"):
            ops.check_op(op, np.dtype(bool))
    with pytest.raises(ValueError, match="unknown reduction op 'mean'"):
        ops.as_op("mean")
