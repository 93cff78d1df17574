"""`rrun --check-build`: what this installation can do, without importing any framework."""

import importlib.metadata
import importlib.util
import sys

import ringreduce
from ringreduce.launcher import dialects
from ringreduce.launcher.errors import LaunchError

FRAMEWORKS = (("PyTorch", "torch", "torch"), ("TensorFlow", "tensorflow", "tensorflow"))
GPU_LIBRARIES = (("CuPy", "cupy", None),)


def report(mpiexec_name=None):
    lines = [f"ringreduce v{ringreduce.__version__} (Python {sys.version.split()[0]}, {sys.executable})", ""]
    lines.append("Available frameworks:")
    lines += [_line(*entry) for entry in FRAMEWORKS]
    lines.append("Available GPU libraries:")
    lines += [_line(*entry) for entry in GPU_LIBRARIES]
    lines.append("MPI:")
    lines.append(_mpi_library())
    lines.append(_mpiexec(mpiexec_name))
    return "\n".join(lines)


def _line(label, module, distribution):
    if importlib.util.find_spec(module) is None:
        return f"    [ ] {label}"
    return f"    [X] {label} {_version(distribution or module)}".rstrip()


def _version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        for candidate in importlib.metadata.packages_distributions().get(distribution, []):
            return importlib.metadata.version(candidate)
        return ""


def _mpi_library():
    import mpi4py

    mpi4py.rc.initialize = False  # read the library's name without starting MPI in rrun
    from mpi4py import MPI

    library = MPI.Get_library_version().strip().splitlines()[0]
    return f"    [X] mpi4py {mpi4py.__version__} on {library}"


def _mpiexec(named):
    try:
        path = dialects.find_mpiexec(named)
        return f"    [X] mpiexec {path} ({dialects.dialect_of(path).name})"
    except LaunchError as error:
        return f"    [ ] mpiexec: {error.message}"
