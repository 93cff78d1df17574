"""Stale averaging, local SGD and DiLoCo refuse bad arguments with errors that name them, before any rank starts."""

import pytest
import torch
import torch_cases


class FourRanks:
    """Stands for a made process set of four ranks (the checks need only its size)."""

    ranks = [0, 1, 2, 3]

    def size(self):
        return 4


def test_bad_arguments_are_clear_errors():
    import ringreduce.torch as rr

    net = torch_cases.model()
    with pytest.raises(ValueError, match="staleness must be 0 .* or 1 .*, got 2"):
        rr.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), staleness=2)
    with pytest.raises(ValueError, match="staleness=1 does not combine with PowerSGD"):
        rr.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), compression=rr.PowerSGD(), staleness=1)
    with pytest.raises(ValueError, match="period must be at least 1, got 0"):
        rr.PeriodicModelAverager(period=0)
    with pytest.raises(ValueError, match="warmup_steps must be at least 0, got -1"):
        rr.PeriodicModelAverager(period=2, warmup_steps=-1)
    with pytest.raises(ValueError, match=r"the last group size \(2\) must be the size of the process set \(4\)"):
        rr.HierarchicalModelAverager({1: 2}, process_set=FourRanks())
    with pytest.raises(ValueError, match=r"every group size must divide the process set's size \(4\), got \[3, 4\]"):
        rr.HierarchicalModelAverager({1: 3, 4: 4}, process_set=FourRanks())

