"""The distributed optimizers' option rules (ringreduce.training.options), pure logic: the one
set of rules torch's, TensorFlow's and Keras's optimizers check when they are built."""

import warnings

import pytest

import ringreduce as rr
from ringreduce.numerics import compression as compressors
from ringreduce.training import options
from ringreduce.training.powersgd import PowerSGD


def test_options_horovod_has_keep_horovods_rules():
    with pytest.raises(ValueError, match="gradient_predivide_factor needs op=Average"):
        options.check(rr.Sum, compressors.Compression.none, gradient_predivide_factor=2.0)
    for passes in (0, 1.5):
        with pytest.raises(ValueError, match="backward_passes_per_step must be at least 1"):
            options.check(rr.Average, compressors.Compression.none, backward_passes_per_step=passes)
    options.check(rr.Average, compressors.Compression.none, gradient_predivide_factor=2.0, backward_passes_per_step=4)


def test_staleness_goes_with_any_op_and_compression_but_powersgd_and_top_k():
    for op in (rr.Average, rr.Sum, rr.Max):
        options.check(op, compressors.Compression.fp16, staleness=1)
    with pytest.raises(ValueError, match="staleness=1 does not combine with PowerSGD"):
        options.check(rr.Average, PowerSGD(), staleness=1)
    with pytest.raises(ValueError, match="staleness=1 does not combine with top-k"):
        options.check(rr.Average, compressors.TopK(0.1), staleness=1)
    with pytest.raises(ValueError, match="staleness must be 0 .* or 1"):
        options.check(rr.Average, compressors.Compression.none, staleness=2)
    with pytest.raises(ValueError, match="PowerSGD averages"):
        options.check(rr.Sum, PowerSGD())


def test_num_groups_is_the_old_name_of_groups_as_in_horovod():
    a, b = object(), object()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert options.groups(3, None, lambda m: True, "tensor") == 3
        assert options.groups(3, [[a], [b]], lambda m: True, "tensor") == [[a], [b]]  # groups wins
    assert [w.category for w in caught] == [DeprecationWarning, DeprecationWarning]
    assert options.groups(0, None, lambda m: True, "tensor") is None


@pytest.mark.parametrize(("groups", "message"), [
    (0, "groups must be a number of groups or a list of lists of tensor, got 0"),
    ([["x"]], "groups must be a number of groups or a list of lists of tensor"),
    ("two", "groups must be a number of groups or a list of lists of tensor"),
])
def test_groups_that_horovod_refuses_are_refused(groups, message):
    with pytest.raises(ValueError, match=message):
        options.groups(0, groups, lambda m: m != "x", "tensor")


def test_a_member_in_two_groups_is_refused():
    a = object()
    with pytest.raises(ValueError, match="a tensor can only appear once in groups"):
        options.groups(0, [[a], [a]], lambda m: True, "tensor")
