"""ringreduce.torch's argument checks that need no ranks."""

import pytest

torch = pytest.importorskip("torch")


def test_named_parameters_must_name_every_parameter_once():
    from ringreduce.torch.optimizer import _parameter_names

    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    groups = [{"params": [a, b]}]
    with pytest.raises(ValueError, match="duplicate names: w"):
        _parameter_names(groups, [("w", a), ("w", b)])
    with pytest.raises(ValueError, match=r"does not name 1 of the optimizer's parameters \(positions \[1\]"):
        _parameter_names(groups, [("w", a)])

