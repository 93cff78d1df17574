"""The GPU side of a process: whether CuPy can run here, which GPU this rank uses, and which
transport the ranks share for device arrays.

CuPy is imported only when it is installed and only when it is needed, so `import ringreduce`
stays fast and works on machines without CUDA. GPU arrays on such a machine get a GpuError
that says why, instead of a traceback from inside CuPy.

The transports, fastest first (Horovod's order): NCCL through cupy.cuda.nccl; MPI that takes
device buffers itself (CUDA-aware, asked of the library, never assumed); staging through pinned
host buffers into the host algorithms. Every rank must use the same one, so init combines the
ranks' capabilities with one bitwise-and.

    python -m ringreduce.machine.gpu     prints what this machine offers (rrun --check-build runs it)
"""

import ctypes
import functools
import glob
import importlib.util
import os
import sys

from ringreduce.errors import GpuError
from ringreduce.machine import gpu_placement

NCCL, CUDA_AWARE_MPI = 1, 2
_NAMES = {NCCL: "NCCL", CUDA_AWARE_MPI: "CUDA-aware MPI"}


@functools.cache
def _load():
    """(cupy, None) when CuPy imports and sees a GPU, else (None, why not). No kernel runs here: the
    first one makes a context on the current device, which before init has chosen one is GPU 0
    for every rank (8 contexts on one GPU; under the exclusive-process compute mode, a failure on
    all ranks but one)."""
    if importlib.util.find_spec("cupy") is None:
        return None, "CuPy is not installed (pip install ringreduce[gpu])"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None, "CuPy sees no GPU here"
    except Exception as error:  # ImportError, CUDARuntimeError, a CuPy built for another CUDA
        return None, f"CuPy cannot use a GPU here: {type(error).__name__}: {error}"
    return cupy, None


@functools.cache
def _usable():
    """_load(), and a kernel run on the current device (the first use is where a missing driver, or
    a GPU another process holds, shows): asked once the device is chosen."""
    cupy, why = _load()
    if cupy is None:
        return None, why
    try:
        cupy.zeros(1).sum().item()
    except Exception as error:
        return None, f"CuPy cannot use a GPU here: {type(error).__name__}: {error}"
    return cupy, None


def cupy_or_none():
    return _usable()[0]


def unavailable_reason():
    """Why CuPy cannot be used here, or None when it can."""
    return _usable()[1]


def require_cupy(what="a GPU array"):
    cupy, why = _usable()
    if cupy is None:
        raise GpuError(f"{what} needs a working CuPy and GPU: {why}")
    return cupy


def ready_event():
    """A CUDA event recorded now on the calling thread's current stream: work queued after it
    (on the engine's stream) waits for what the caller queued before it."""
    event = require_cupy().cuda.Event(disable_timing=True)
    event.record()
    return event


def device_for(local_rank, device_count, current_device, visible_devices, placement=None):
    """The GPU this rank should use, or None to leave the user's choice alone.

    The user has chosen when CUDA_VISIBLE_DEVICES shows this rank a single GPU, or when the
    current device is not the default 0 (they called set_device before init). Otherwise the GPU
    `placement` gives the host's local rank r (gpu_placement.choose_devices: the one nearest the
    CPUs it is bound to), or without one GPU r modulo the count (more ranks than GPUs share them
    in turn).
    """
    if device_count == 0 or current_device != 0:
        return None
    if visible_devices is not None and len([d for d in visible_devices.split(",") if d.strip()]) == 1:
        return None
    return placement[local_rank] if placement else local_rank % device_count


def _cupy_at_init(probe=True):
    """CuPy for init's choices: where the program has imported it already, or where the machine
    shows an NVIDIA device; elsewhere it is not even imported (that alone would cost every rank
    of a CPU job a second). `probe`: run a kernel on the current device to be sure it works."""
    if "cupy" not in sys.modules and not (
            glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/dxg")):
        return None
    return cupy_or_none() if probe else _load()[0]


def select_device(host_comm, environ=os.environ):
    """At init, collective over the host's ranks (`host_comm`): make `device_for`'s GPU CuPy's
    current device (and torch's, if it is loaded), the one nearest the CPUs each rank may run on.
    Returns the device index in use, or None where no GPU is usable."""
    affinities = host_comm.allgather(frozenset(os.sched_getaffinity(0)))
    cupy = _cupy_at_init(probe=False)  # no kernel before the device is chosen
    if cupy is None:
        return None
    count = cupy.cuda.runtime.getDeviceCount()
    near_by_bus = dict(gpu_placement.host_gpus())
    near = [near_by_bus.get(gpu_placement.normal_bus_id(cupy.cuda.Device(index).pci_bus_id)) for index in range(count)]
    local_rank = host_comm.Get_rank()
    device = device_for(local_rank, count, cupy.cuda.Device().id, environ.get("CUDA_VISIBLE_DEVICES"),
                        gpu_placement.choose_devices(affinities, near))
    # Only where ringreduce chooses: a rank shown one GPU of its own (srun --gpus-per-task) shares none.
    if device is not None and count < len(affinities) and local_rank == 0:
        print(f"ringreduce: warning: {len(affinities)} ranks on this host see {count} GPU(s) "
              f"(CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): ranks share GPUs, and NCCL "
              "refuses two ranks on one GPU (under Slurm, --gpus-per-task hides the others from mpiexec's step: "
              "ask --gpus-per-node)", file=sys.stderr, flush=True)
    if device is not None:
        cupy.cuda.Device(device).use()
        torch = sys.modules.get("torch")  # loaded by the program already; never imported here
        if torch is not None and torch.cuda.is_available():
            torch.cuda.set_device(device)
    return cupy.cuda.Device().id if cupy_or_none() is not None else None


def local_capabilities(host_comm):
    """This rank's bits: NCCL when cupy.cuda.nccl loads and no other rank of this host uses the
    same GPU (NCCL refuses two ranks on one device), CUDA_AWARE_MPI when the MPI library says so.
    Collective over `host_comm`."""
    cupy = _cupy_at_init()
    device = cupy.cuda.Device().pci_bus_id if cupy is not None else None
    devices = host_comm.allgather(device)
    bits = 0
    if cupy is not None and devices.count(device) == 1 and nccl_module() is not None:
        bits |= NCCL
    if cupy is not None and mpi_takes_device_buffers():
        bits |= CUDA_AWARE_MPI
    return bits


@functools.cache
def nccl_module():
    try:
        from cupy.cuda import nccl

        nccl.get_version()
    except Exception:  # not built with NCCL, or libnccl missing
        return None
    return nccl


def mpi_takes_device_buffers():
    """Does the loaded MPI library accept CUDA device buffers? Asked through the extension each
    library offers (Open MPI's MPIX_Query_cuda_support, MPICH's MPIX_GPU_query_support);
    RINGREDUCE_CUDA_AWARE_MPI=1/0 overrides it for libraries that cannot tell."""
    forced = os.environ.get("RINGREDUCE_CUDA_AWARE_MPI", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    from mpi4py import MPI

    library = ctypes.CDLL(MPI.__file__)  # its symbol lookup also searches the MPI library it links
    if hasattr(library, "MPIX_GPU_query_support"):
        supported = ctypes.c_int(0)
        library.MPIX_GPU_query_support(0, ctypes.byref(supported))  # 0: MPIX_GPU_SUPPORT_CUDA
        return supported.value == 1
    if hasattr(library, "MPIX_Query_cuda_support"):
        return library.MPIX_Query_cuda_support() == 1
    return False


def choose_transport(requested, shared_bits):
    """The transport for device arrays from what every rank offers (`shared_bits`); a transport
    that was asked for by name but is missing on some rank is an error."""
    if requested == "auto":
        if shared_bits & NCCL:
            return "nccl"
        return "mpi" if shared_bits & CUDA_AWARE_MPI else "staged"
    needed = {"nccl": NCCL, "mpi": CUDA_AWARE_MPI}.get(requested)
    if needed is not None and not shared_bits & needed:
        raise GpuError(f"RINGREDUCE_GPU_TRANSPORT={requested} but {_NAMES[needed]} is not available on "
                       "every rank (see rrun --check-build)")
    return requested


def report_lines():
    """What --check-build shows about GPUs (MPI is initialized as a single process)."""
    cupy, why = _usable()
    if cupy is None:
        return [f"    [ ] GPU arrays: {why}"]
    count = cupy.cuda.runtime.getDeviceCount()
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    nccl = nccl_module()
    lines = [f"    [X] CuPy {cupy.__version__}: {count} GPU(s), {name}"]
    lines.append(f"    [X] NCCL {nccl.get_version()}" if nccl else "    [ ] NCCL: cupy.cuda.nccl does not load")
    lines.append(f"    [{'X' if mpi_takes_device_buffers() else ' '}] CUDA-aware MPI")
    lines.append("    [X] staging through pinned host memory")
    return lines


if __name__ == "__main__":
    print("\n".join(report_lines()))
