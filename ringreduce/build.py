"""What this installation of ringreduce offers, in the build queries Horovod scripts ask
(`hvd.nccl_built()` and the rest), answered for ringreduce: it always runs on MPI, never on Gloo,
oneCCL, DDL or ROCm; NCCL and CUDA where CuPy can use them on this machine."""

from ringreduce.machine import gpu


def mpi_built() -> bool:
    return True


def mpi_enabled() -> bool:
    return True


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> int:
    """NCCL's version code where CuPy's NCCL loads here, else 0 (as Horovod's answer)."""
    nccl = gpu.nccl_module()
    return nccl.get_version() if nccl is not None else 0


def cuda_built() -> bool:
    """Can collectives run on CUDA arrays here (CuPy installed and using a GPU)?"""
    return gpu.unavailable_reason() is None


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def rocm_built() -> bool:
    return False
