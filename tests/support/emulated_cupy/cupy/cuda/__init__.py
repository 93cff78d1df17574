"""cupy.cuda, emulated: one device per process, as when each rank sees its own GPU (or, with
EMULATED_CUPY_SHARED_GPU=1, every rank on the same one), streams and events that are always
complete, and copies that are memmoves.

Arrays remember the stream current where they were made (`_stream`: CuPy's memory pool keeps a
freed block for that stream). EMULATED_CUPY_DEVICES=N shows every process the same N GPUs instead
(a node's), with a current device per thread, as CUDA's, that Device(i).use() sets, and arrays
made on the current device of the thread that made them; with EMULATED_CUPY_EXCLUSIVE_DIR=DIR as well, a GPU takes the
context of one process only, as under the exclusive-process compute mode: the first array a
process makes on a device claims it (a file in DIR), and another process's first array there
fails, as CUDA's cudaErrorDevicesUnavailable."""

import contextlib
import ctypes
import itertools
import os
import threading
import time
import weakref

import numpy

from cupy.cuda import nccl  # noqa: F401  (cupy.cuda.nccl, as CuPy has it)

_DEVICES = int(os.environ.get("EMULATED_CUPY_DEVICES", "0"))
_BUS_ID = "emulated-0" if os.environ.get("EMULATED_CUPY_SHARED_GPU") == "1" else f"emulated-{os.getpid()}"
_threads = threading.local()  # .device: the calling thread's current device, 0 until it sets one
_contexts = set()  # the devices this process has made a context on


def current():
    return getattr(_threads, "device", 0)


class CUDARuntimeError(RuntimeError):
    pass


def make_context():
    """What a kernel or an allocation does first on the current device: make this process's context."""
    device = current()
    if device in _contexts:
        return
    claims = os.environ.get("EMULATED_CUPY_EXCLUSIVE_DIR")
    if claims:
        try:
            os.close(os.open(os.path.join(claims, f"device-{device}"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            raise CUDARuntimeError(f"cudaErrorDevicesUnavailable: device {device} is in exclusive-process "
                                   "mode and another process has a context on it") from None
    _contexts.add(device)


class Device:
    def __init__(self, device=None):
        self.id = current() if device is None else int(getattr(device, "id", device))

    @property
    def pci_bus_id(self):
        return f"0000:{self.id + 1:02x}:00.0" if _DEVICES else _BUS_ID

    def use(self):
        _threads.device = self.id

    def synchronize(self):
        pass

    def __enter__(self):
        self._previous = current()
        self.use()
        return self

    def __exit__(self, *exc):
        Device(self._previous).use()
        return False


class Event:
    """Complete at once, unless recorded on a stream whose work hangs (see Stream)."""

    def __init__(self, disable_timing=False):
        self._stream = None

    def record(self, stream=None):
        self._stream = stream

    @property
    def done(self):
        return self._stream is None or not self._stream.hung

    def synchronize(self):
        while not self.done:
            time.sleep(0.01)


class Stream(contextlib.nullcontext):
    """Its work is done as it is queued, except where the emulated NCCL hangs it (a peer died
    mid-collective, as a real NCCL kernel then spins forever): from then on its events are never
    done and synchronize() never returns, until that NCCL communicator is aborted."""

    def __init__(self, non_blocking=False):
        super().__init__()
        self.ptr = next(_stream_numbers)
        self.hung = False
        _streams[self.ptr] = self

    def record(self):
        event = Event()
        event.record(self)
        return event

    def wait_event(self, event):
        event.synchronize()

    def synchronize(self):
        while self.hung:
            time.sleep(0.01)

    def __enter__(self):
        _threads.streams = [*getattr(_threads, "streams", []), self]
        return self

    def __exit__(self, *exc):
        _threads.streams.pop()
        return False


def get_current_stream():
    """The calling thread's current stream (entered with `with stream:`), else the null stream."""
    entered = getattr(_threads, "streams", [])
    return entered[-1] if entered else Stream.null


_stream_numbers = itertools.count(0)  # 0: CUDA's null stream, made below
_streams = {}  # ptr -> Stream, for the emulated NCCL, which is given pointers


def stream_at(ptr):
    return _streams.get(ptr)


Stream.null = Stream()


_allocations = {}  # address -> (bytes, device) of each live device array's memory


def allocated(array):
    """Remember the memory of `array` (of the array that owns it) as device memory of the current
    device, until it is freed."""
    while isinstance(array.base, numpy.ndarray):
        array = array.base
    address = array.ctypes.data
    if address not in _allocations:
        _allocations[address] = (array.nbytes, current())
        weakref.finalize(array, _allocations.pop, address, None)


def check_device_pointer(pointer, nbytes, what):
    """Raise, as CUDA would fault, unless [pointer, pointer + nbytes) lies in live device memory;
    returns the device it is on."""
    for address, (size, device) in list(_allocations.items()):  # another thread may free one meanwhile
        if address <= pointer and pointer + nbytes <= address + size:
            return device
    raise CUDARuntimeError(f"cudaErrorIllegalAddress: {what} at {pointer:#x} ({nbytes} bytes) is not in any "
                           "live device array")


class runtime:  # noqa: N801  (CuPy's name)
    memcpyHostToDevice, memcpyDeviceToHost = 1, 2

    CUDARuntimeError = CUDARuntimeError

    @staticmethod
    def getDeviceCount():  # noqa: N802
        return _DEVICES or 1

    @staticmethod
    def getDeviceProperties(device):  # noqa: N802
        return {"name": b"emulated GPU"}

    @staticmethod
    def memcpyAsync(dst, src, size, kind, stream):  # noqa: N802
        device = dst if kind == runtime.memcpyHostToDevice else src
        check_device_pointer(device, size, "the device side of a copy")
        ctypes.memmove(dst, src, size)


def alloc_pinned_memory(nbytes):
    return bytearray(nbytes)
