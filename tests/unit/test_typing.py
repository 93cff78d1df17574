"""The public API is typed (make lint runs mypy over it): every public function and class that
`ringreduce` and its bindings offer has its parameters and results annotated, so editors complete
and check the calls."""

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


def _unannotated_names(module, names):
    """What lacks an annotation among `module`'s `names` defined in ringreduce: functions, and
    the public methods (and __init__) of classes."""
    missing = []
    for name in names:
        value = getattr(module, name)
        if inspect.isfunction(value) and value.__module__.startswith("ringreduce"):
            missing += _unannotated(value, name)
        elif inspect.isclass(value) and not issubclass(value, BaseException) and value.__module__.startswith(
                "ringreduce") and not isinstance(value, type(ringreduce.ReduceOp)):
            for attribute, member in vars(value).items():
                if inspect.isfunction(member) and (not attribute.startswith("_") or attribute == "__init__"):
                    missing += _unannotated(member, f"{name}.{attribute}")
    return missing


def test_every_public_function_and_class_of_ringreduce_is_annotated():
    assert _unannotated_names(ringreduce, ringreduce.__all__) == []


def test_the_package_says_it_is_typed():
    assert (pathlib.Path(ringreduce.__path__[0]) / "py.typed").is_file()


@pytest.mark.parametrize("binding", ["ringreduce.torch", "ringreduce.torch.elastic", "ringreduce.tensorflow",
                                     "ringreduce.tensorflow.elastic", "ringreduce.tensorflow.keras",
                                     "ringreduce.tensorflow.keras.elastic"])
def test_every_public_function_and_class_of_the_bindings_is_annotated(binding):
    """Every name a user reaches through the binding (as `hvd.X`), whichever module defines it."""
    module = pytest.importorskip(binding)
    names = [name for name in dir(module) if not name.startswith("_")]
    assert len(names) >= 5 and _unannotated_names(module, names) == []
