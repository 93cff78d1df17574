"""RINGREDUCE_DETERMINISTIC's rules, as pure logic: which reductions must add in rank order, which
family runs them, and where the switch comes from (the variable, rrun's flag, torch's)."""

import numpy as np
import pytest

from ringreduce import config
from ringreduce.algorithms.choice import AlgorithmSelector
from ringreduce.numerics import reduction
from ringreduce.ops import ReduceOp


class Recording:
    """A family that records the reductions it was given."""

    reads_concatenation = True
    reduces_any_dtype = True

    def __init__(self, adds_in_rank_order):
        self.adds_in_rank_order = adds_in_rank_order
        self.calls = []

    def allreduce(self, buf, op, source=None, scale_result=None):
        self.calls.append((buf.dtype.name, op))

    def reducescatter(self, buf, offsets, op, source=None):
        self.calls.append((buf.dtype.name, op))


@pytest.mark.parametrize("op, dtype, sensitive", [
    (ReduceOp.SUM, "float32", True), (ReduceOp.AVERAGE, "float16", True), (ReduceOp.PRODUCT, "float64", True),
    (ReduceOp.SUM, "complex64", True), (ReduceOp.SUM, "int64", False), (ReduceOp.MAX, "float32", False),
    (ReduceOp.MIN, "float64", False), (ReduceOp.SUM, "bool", False),
])
def test_only_float_sums_and_products_depend_on_the_order_of_addition(op, dtype, sensitive):
    assert reduction.order_sensitive(op, dtype) is sensitive


def test_the_switch_replaces_a_family_that_adds_in_its_own_order_and_keeps_one_that_adds_in_rank_order():
    ring, shm, ordered = Recording(False), Recording(True), Recording(True)
    tables = {"allreduce": [(0, "ring"), (1 << 20, "shm")], "reducescatter": [(0, "ring")]}
    selector = AlgorithmSelector(tables, {"ring": ring, "shm": shm}, rank_order=ordered)
    selector.allreduce(np.zeros(8, np.float32), ReduceOp.SUM)  # the ring's order: replaced
    selector.allreduce(np.zeros(8, np.int64), ReduceOp.SUM)  # exact in any order: the ring
    selector.allreduce(np.zeros(8, np.float32), ReduceOp.MAX)
    selector.allreduce(np.zeros(1 << 20, np.float32), ReduceOp.SUM)  # shared memory adds in rank order
    selector.reducescatter(np.zeros(8, np.float64), [0, 8], ReduceOp.AVERAGE)
    assert ordered.calls == [("float32", ReduceOp.SUM), ("float64", ReduceOp.AVERAGE)]
    assert ring.calls == [("int64", ReduceOp.SUM), ("float32", ReduceOp.MAX)]
    assert shm.calls == [("float32", ReduceOp.SUM)]
    # A fused group is packed for the rank-order family, read where it lies by shared memory.
    assert not selector.reads_concatenation_at(64) and selector.reads_concatenation_at(1 << 20)
    AlgorithmSelector(tables, {"ring": ring, "shm": shm}).allreduce(np.zeros(8, np.float32), ReduceOp.SUM)
    assert ring.calls[-1] == ("float32", ReduceOp.SUM) and len(ordered.calls) == 2  # off: the ring's own order


def test_the_switch_comes_from_the_variable_else_from_what_a_binding_lends(monkeypatch):
    assert config.Config.from_env({}).deterministic is False
    assert config.Config.from_env({"RINGREDUCE_DETERMINISTIC": "1"}).deterministic is True
    monkeypatch.setattr(config, "_LENT_DEFAULTS", {})
    config.lend_default("deterministic", lambda: True)  # torch.use_deterministic_algorithms(True)
    assert config.Config.from_env({}).deterministic is True
    assert config.Config.from_env({"RINGREDUCE_DETERMINISTIC": "0"}).deterministic is False


def test_torch_s_deterministic_algorithms_turn_it_on():
    torch = pytest.importorskip("torch")
    import ringreduce.torch  # noqa: F401  (lends the default)

    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert config.Config.from_env({}).deterministic is True
        torch.use_deterministic_algorithms(False)
        assert config.Config.from_env({}).deterministic is False
    finally:
        torch.use_deterministic_algorithms(before)
