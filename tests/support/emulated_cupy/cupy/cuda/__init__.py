"""cupy.cuda, emulated: one device per process, as when each rank sees its own GPU (or, with
EMULATED_CUPY_SHARED_GPU=1, every rank on the same one), streams that queue their work until
something waits for it (Stream), copies that are memmoves queued on their stream, and device
memory that pointers are checked against.

Arrays remember the stream current where they were made (`_stream`: CuPy's memory pool keeps a
freed block for that stream). EMULATED_CUPY_DEVICES=N shows every process the same N GPUs instead
(a node's), with a current device per thread, as CUDA's, that Device(i).use() sets, and arrays
made on the current device of the thread that made them; with EMULATED_CUPY_EXCLUSIVE_DIR=DIR as
well, a GPU takes the context of one process only, as under the exclusive-process compute mode: the first array a
process makes on a device claims it (a file in DIR), and another process's first array there
fails, as CUDA's cudaErrorDevicesUnavailable."""

import collections
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
        for stream in _streams.copy().values():  # as check_device_pointer copies _allocations
            stream.synchronize()

    def __enter__(self):
        self._previous = current()
        self.use()
        return self

    def __exit__(self, *exc):
        Device(self._previous).use()
        return False


class Event:
    """A point in a stream's queue: done once the stream has run its work up to that point."""

    def __init__(self, disable_timing=False):
        self._stream, self._position = None, 0

    def record(self, stream=None):
        self._stream = get_current_stream() if stream is None else stream
        self._position = self._stream.queued

    @property
    def done(self):
        return self._stream is None or self._stream.run_until(self._position)

    def synchronize(self):
        while not self.done:
            time.sleep(0.01)


class Stream(contextlib.nullcontext):
    """A queue of work, as a CUDA stream: kernels, copies and NCCL calls queued on a stream other
    than the null stream run only when the stream is synchronized, an event recorded on it is
    waited for or asked whether it is done, or a host operation on a device array runs with the
    stream current (each in submission order), so a missing wait reads stale data. Work queued on
    the null stream runs at once. The emulated NCCL hangs a stream whose collective lost a peer
    (as a real NCCL kernel then spins forever): its later work never runs, its events are never
    done and synchronize() never returns, until that communicator is aborted."""

    def __init__(self, non_blocking=False):
        super().__init__()
        self.ptr = next(_stream_numbers)
        self.hung = False
        self.queued = 0  # how much work was ever queued here; self.ran: how much has run
        self.ran = 0
        self._work = collections.deque()
        self._lock = threading.RLock()
        _streams[self.ptr] = self

    def enqueue(self, work):
        """Queue `work()` (which returns False where it hangs the stream), or run it now on the null stream."""
        with self._lock:
            self._work.append(work)
            self.queued += 1
        if self.ptr == 0:
            self.run_until(self.queued)

    def run_until(self, position):
        """Run the queued work up to `position`; whether all of it has run (not while hung)."""
        with self._lock:
            while self.ran < position and not self.hung:
                if self._work[0]() is False:
                    self.hung = True
                    break
                self._work.popleft()
                self.ran += 1
            return self.ran >= position and not self.hung

    def abandon(self):
        """What aborting the NCCL communicator that hung this stream does: its queued work is dropped."""
        with self._lock:
            self.ran += len(self._work)
            self._work.clear()
            self.hung = False

    def record(self):
        event = Event()
        event.record(self)
        return event

    def wait_event(self, event):
        self.enqueue(lambda: event.synchronize())

    def synchronize(self):
        while not self.run_until(self.queued):
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
    # A copy made in one C call: a finalizer (another thread's, or the garbage collector's run by an
    # allocation on this one, as list() of the items could be) may free an array meanwhile.
    for address, (size, device) in _allocations.copy().items():
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
        def copy():
            ctypes.memmove(dst, src, size)
        stream_at(stream).enqueue(copy)


def alloc_pinned_memory(nbytes):
    return bytearray(nbytes)
