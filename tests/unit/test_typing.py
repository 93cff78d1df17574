"""The core's public API is typed (make lint runs mypy over it): every public function and class
that `ringreduce` exports has its parameters and results annotated, so editors complete and check
the calls."""

import inspect
import pathlib

import pytest

import ringreduce


def _unannotated(function, where):
    signature = inspect.signature(function)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    missing = [f"{where}({name})" for name, parameter in signature.parameters.items()
               if name not in ("self", "cls") and parameter.kind not in variadic
               and parameter.annotation is inspect.Parameter.empty]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append(f"{where} -> ?")
    return missing


def test_every_public_function_and_class_of_ringreduce_is_annotated():
    missing = []
    for name in ringreduce.__all__:
        value = getattr(ringreduce, name)
        if inspect.isfunction(value):
            missing += _unannotated(value, name)
        elif inspect.isclass(value) and not issubclass(value, BaseException) and value.__module__.startswith(
                "ringreduce") and not isinstance(value, type(ringreduce.ReduceOp)):
            for attribute, member in vars(value).items():
                if inspect.isfunction(member) and (not attribute.startswith("_") or attribute == "__init__"):
                    missing += _unannotated(member, f"{name}.{attribute}")
    assert missing == []


def test_the_package_says_it_is_typed():
    assert (pathlib.Path(ringreduce.__path__[0]) / "py.typed").is_file()


@pytest.mark.parametrize(("binding", "typed"), [
    ("ringreduce.torch", ("tensors", "differentiable", "functions", "optimizer")),
    ("ringreduce.tensorflow", ("tensors", "variables", "optimizer", "tape")),
    ("ringreduce.tensorflow.keras", ("optimizer", "values")),
])
def test_the_bindings_collectives_broadcasts_and_optimizers_are_annotated(binding, typed):
    """Each binding's collectives, broadcasts, DistributedOptimizer and tape (the rest of the
    bindings is not annotated yet)."""
    module = pytest.importorskip(binding)
    missing, checked = [], 0
    for name in dir(module):
        value = getattr(module, name)
        if inspect.isfunction(value) and value.__module__ in {f"{binding}.{m}" for m in typed} \
                and not name.startswith("_"):
            checked += 1
            missing += _unannotated(value, name)
    assert checked >= 6 and missing == []
