"""cupy.cuda, emulated: one device per process, as when each rank sees its own GPU (or, with
EMULATED_CUPY_SHARED_GPU=1, every rank on the same one), streams and events that are always
complete, and copies that are memmoves."""

import contextlib
import ctypes
import os

from cupy.cuda import nccl  # noqa: F401  (cupy.cuda.nccl, as CuPy has it)

_BUS_ID = "emulated-0" if os.environ.get("EMULATED_CUPY_SHARED_GPU") == "1" else f"emulated-{os.getpid()}"


class Device:
    pci_bus_id = _BUS_ID

    def __init__(self, device=0):
        self.id = device

    def use(self):
        pass

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Event:
    def __init__(self, disable_timing=False):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class Stream(contextlib.nullcontext):
    ptr = 0

    def __init__(self, non_blocking=False):
        super().__init__()

    def record(self):
        return Event()

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


class runtime:  # noqa: N801  (CuPy's name)
    memcpyHostToDevice, memcpyDeviceToHost = 1, 2

    @staticmethod
    def getDeviceCount():  # noqa: N802
        return 1

    @staticmethod
    def getDeviceProperties(device):  # noqa: N802
        return {"name": b"emulated GPU"}

    @staticmethod
    def memcpyAsync(dst, src, size, kind, stream):  # noqa: N802
        ctypes.memmove(dst, src, size)


def alloc_pinned_memory(nbytes):
    return bytearray(nbytes)
