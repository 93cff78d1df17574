"""An emulated CuPy for machines without a GPU, put on a job's PYTHONPATH by the tests: its
arrays are numpy arrays in host memory whose type lives in a module named cupy (which is how
ringreduce tells a CuPy array), its streams and events are complete at once, its "device"
copies are memmoves, its one kernel is the same formula run by numpy, and its NCCL is MPI.

It lets the GPU path run end to end under the real rrun and MPI (device tagging, the device
executor, the staging transport's copies and chunks); it says nothing about CUDA itself, which
tests/jobs/gpu/test_gpu.py checks on a machine with a GPU.
"""


import numpy as np
from numpy import all, bool_, float16, float32, float64, int8, int16, int32, int64, uint8  # noqa: F401, A004

__version__ = "emulated"


class ndarray(np.ndarray):  # noqa: N801  (CuPy's name)
    """A host array that passes for a CuPy array."""

    @property
    def data(self):
        return _Pointer(self.ctypes.data)

    def __array_finalize__(self, obj):
        self._device = getattr(obj, "_device", None)  # a view's, or set by _on_device
        self._stream = getattr(obj, "_stream", None)
        cuda.allocated(self)  # new memory where numpy made it for an operation on device arrays

    @property
    def device(self):
        return cuda.Device(self._device)

    def set(self, values):
        self[...] = values

    def get(self, out=None):
        if out is None:
            return np.array(self, copy=True).view(np.ndarray)
        out[...] = self
        return out


class _Pointer:
    def __init__(self, ptr):
        self.ptr = ptr


def _on_device(array):
    """A new device array, on the calling thread's current device, its memory known as device
    memory (cuda.check_device_pointer) while it lives."""
    cuda.make_context()
    cuda.allocated(array)
    array = array.view(ndarray)
    array._device = cuda.current()
    array._stream = cuda.get_current_stream().ptr
    return array


def empty(shape, dtype=float):
    return _on_device(np.empty(shape, dtype))


def zeros(shape, dtype=float):
    return _on_device(np.zeros(shape, dtype))


def empty_like(array):
    return _on_device(np.empty_like(array))


def full(shape, value, dtype=None):
    return _on_device(np.full(shape, value, dtype))


def eye(n, dtype=float):
    return _on_device(np.eye(n, dtype=dtype))


def asnumpy(array):
    return np.array(array, copy=True).view(np.ndarray)


def asarray(values, dtype=None):
    return _on_device(np.array(values, dtype=dtype, copy=True))


def array(values, dtype=None, order="C", copy=True):
    return _on_device(np.array(values, dtype=dtype, order=order, copy=True))


def matmul(a, b, out=None):
    return np.matmul(a, b, out=out) if out is not None else _on_device(np.matmul(a, b))


def subtract(a, b, out=None):
    return np.subtract(a, b, out=out) if out is not None else _on_device(np.subtract(a, b))


class linalg:  # noqa: N801  (CuPy's module)
    @staticmethod
    def qr(array):
        return tuple(_on_device(factor) for factor in np.linalg.qr(array))


def ElementwiseKernel(inputs, outputs, body, name):  # noqa: N802  (CuPy's name)
    if body != "y = (U)((double)x * factor)":
        raise NotImplementedError(f"the emulated CuPy knows only ringreduce's scaled cast, not {body!r}")

    def scaled_cast(x, factor, y):
        np.copyto(y, np.asarray(x).astype(np.float64) * factor, casting="unsafe")

    return scaled_cast


from cupy import cuda  # noqa: E402  (after ndarray, which cupy.cuda does not need)
