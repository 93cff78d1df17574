"""`rrun --check-build`: what this installation can do, without importing any framework."""

import ctypes
import importlib.metadata
import importlib.util
import subprocess
import sys

import ringreduce
from ringreduce.launcher import dialects
from ringreduce.launcher.errors import LaunchError

GPU_CHECK_SECONDS = 60
FRAMEWORKS = (("PyTorch", "torch"), ("TensorFlow", "tensorflow"))


def report(mpiexec_name=None):
    lines = [f"ringreduce v{ringreduce.__version__} (Python {sys.version.split()[0]}, {sys.executable})", ""]
    lines.append("Available frameworks:")
    lines += [_module_line(label, module) for label, module in FRAMEWORKS]
    lines.append("GPU arrays and their transports (the first one checked is the default):")
    lines += _gpu_lines()
    lines.append("MPI:")
    lines += _mpi_lines(mpiexec_name)
    return "\n".join(lines)


def _gpu_lines():
    """ringreduce.machine.gpu's own report, from a child process: CuPy and MPI are loaded there (MPI as a
    single process, to ask it about device buffers), never in rrun itself."""
    try:
        done = subprocess.run([sys.executable, "-m", "ringreduce.machine.gpu"], capture_output=True, text=True,
                              timeout=GPU_CHECK_SECONDS)
    except subprocess.TimeoutExpired:
        return [f"    [ ] could not be checked: no answer in {GPU_CHECK_SECONDS} s"]
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [f"    [ ] could not be checked: {last}"]
    return done.stdout.rstrip("\n").splitlines()


def _module_line(label, module):
    if importlib.util.find_spec(module) is None:
        return f"    [ ] {label}"
    return f"    [X] {label} {_version(module)}".rstrip()


def _version(module):
    distributions = importlib.metadata.packages_distributions().get(module, [module])
    try:
        return importlib.metadata.version(distributions[0])
    except importlib.metadata.PackageNotFoundError:
        return ""


def _mpi_lines(mpiexec_name):
    library, problem = _mpi_library()
    lines = [f"    [X] mpi4py {library}" if library else f"    [ ] mpi4py: {problem}"]
    if library and _has_persistent_collectives():
        lines.append("    [X] persistent collectives (MPI_Allreduce_init): small allreduces are set up once")
    elif library:
        lines.append("    [!] no persistent collectives (MPI_Allreduce_init, MPI 4.0) in this MPI: every small "
                     "allreduce is a fresh non-blocking call, several times slower")
    try:
        path = dialects.find_mpiexec(mpiexec_name)
        launcher = dialects.dialect_of(path)
    except LaunchError as error:
        return lines + [f"    [ ] mpiexec: {error.message}"]
    lines.append(f"    [X] mpiexec {path} ({launcher.name})")
    in_place, why = dialects.shrinks_in_place(path, launcher)
    lines.append("    [X] fault tolerance (ULFM: revoke, shrink, agree; mpiexec --with-ft ulfm): the survivors of a "
                 "failed rank of an elastic job go on in place" if in_place
                 else f"    [ ] fault tolerance (ULFM): {why}; elastic jobs restart their processes")
    linked = dialects.detect(library or "")
    if linked is not None and linked.name != launcher.name:
        lines.append(
            f"    [!] mpi4py uses {linked.name} but this mpiexec is {launcher.name}: the ranks would not "
            "find each other. Use the matching mpiexec (--mpiexec) or rebuild mpi4py against this MPI "
            "(see the README)."
        )
    return lines


def _has_persistent_collectives():
    """Does the MPI library mpi4py loaded have MPI 4.0's persistent collectives? (Open MPI 5 has
    them while it reports the 3.1 standard, so the symbol tells, not the version.)"""
    from mpi4py import MPI

    return hasattr(ctypes.CDLL(MPI.__file__), "MPI_Allreduce_init")  # also searches the library it links


def _mpi_library():
    """(mpi4py's version and the MPI library it loaded, None) or (None, why it cannot load)."""
    try:
        import mpi4py

        mpi4py.rc.initialize = False  # read the library's name without starting MPI in rrun
        from mpi4py import MPI
    except ImportError as error:
        return None, f"cannot be loaded: {error}"
    library = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    return f"{mpi4py.__version__} on {library}", None
