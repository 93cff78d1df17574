"""A stand-in `horovod` package for running Horovod's own test suites against ringreduce.

Every Horovod module a suite imports is ringreduce's module under Horovod's name: importing
`horovod.torch` gives `ringreduce.torch` itself, so every collective, class and error the
suites exercise is ringreduce's. The few names below that are not ringreduce's are the
suites' own helpers (version comparison, a daemon thread, TensorFlow's eagerness query).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import threading
import types

__version__ = "0.28.1"

ALIASES = {
    "horovod.torch": "ringreduce.torch",
    "horovod.torch.elastic": "ringreduce.torch.elastic",
    "horovod.tensorflow": "ringreduce.tensorflow",
    "horovod.tensorflow.keras": "ringreduce.tensorflow.keras",
    "horovod.tensorflow.keras.callbacks": "ringreduce.tensorflow.keras.callbacks",
    "horovod.tensorflow.keras.elastic": "ringreduce.tensorflow.keras.elastic",
    "horovod.keras": "ringreduce.tensorflow.keras",
}


def _is_version_greater_equal_than(actual: str, expected: str) -> bool:
    from packaging.version import Version

    return Version(actual) >= Version(expected)


def _in_thread(target, args=(), name=None, daemon=True, silent=False):
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def _executing_eagerly() -> bool:
    import ringreduce.tensorflow

    return ringreduce.tensorflow._executing_eagerly()


HELPERS = {
    "horovod.common": {},
    "horovod.common.util": {"is_version_greater_equal_than": _is_version_greater_equal_than},
    "horovod.runner": {},
    "horovod.runner.util": {},
    "horovod.runner.util.threads": {"in_thread": _in_thread},
    "horovod.tensorflow.util": {"_executing_eagerly": _executing_eagerly},
}


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec):
        if spec.name in ALIASES:
            module = importlib.import_module(ALIASES[spec.name])
            spec.loader_state = module.__spec__
            return module
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__dict__.update(HELPERS[spec.name])
        return module

    def exec_module(self, module):
        if module.__spec__.loader_state is not None:  # the import machinery set Horovod's spec
            module.__spec__ = module.__spec__.loader_state


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ALIASES or name in HELPERS:
            return importlib.util.spec_from_loader(name, _AliasLoader(), is_package=True)
        return None


sys.meta_path.insert(0, _AliasFinder())
