"""An emulated CuPy for machines without a GPU, put on a job's PYTHONPATH by the tests: its
arrays are numpy arrays in host memory whose type lives in a module named cupy (which is how
ringreduce tells a CuPy array), its streams queue kernels, copies and NCCL calls until something
waits for them (cuda.Stream), its "device" copies are memmoves, its kernels are the same
formulas run by numpy, and its NCCL is MPI.

It lets the GPU path run end to end under the real rrun and MPI (device tagging, the device
executor, the staging transport's copies and chunks); it says nothing about CUDA itself, which
tests/jobs/gpu/test_gpu.py checks on a machine with a GPU.
"""


import numpy as np
from numpy import all, bool_, float16, float32, float64, int8, int16, int32, int64, uint8  # noqa: F401, A004

__version__ = "emulated"


class ndarray(np.ndarray):  # noqa: N801  (CuPy's name)
    """A host array that passes for a CuPy array. What numpy does to it (operators, assignments,
    fill, get) runs at once, after the work queued on the current stream (cuda.Stream): as a
    kernel queued there would."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _after_current_stream()
        plain = [value.view(np.ndarray) if isinstance(value, ndarray) else value for value in inputs]
        if out is not None:
            kwargs["out"] = tuple(value.view(np.ndarray) if isinstance(value, ndarray) else value for value in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _on_device(result) if isinstance(result, np.ndarray) else result

    def __setitem__(self, key, value):
        _after_current_stream()
        super().__setitem__(key, value)

    def fill(self, value):
        _after_current_stream()
        super().fill(value)

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
        _after_current_stream()
        if out is None:
            return np.array(self, copy=True).view(np.ndarray)
        out[...] = self
        return out


class _Pointer:
    def __init__(self, ptr):
        self.ptr = ptr


def _after_current_stream():
    cuda.get_current_stream().synchronize()


def _queued(result, compute):
    """`result`, to be filled by `compute()` when the current stream's work reaches it."""
    def work():
        compute()
    cuda.get_current_stream().enqueue(work)
    return result


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
    _after_current_stream()
    return np.array(array, copy=True).view(np.ndarray)


def asarray(values, dtype=None):
    return _on_device(np.array(values, dtype=dtype, copy=True))


def array(values, dtype=None, order="C", copy=True):
    return _on_device(np.array(values, dtype=dtype, order=order, copy=True))


def matmul(a, b, out=None):
    out = empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]),
                np.result_type(a, b)) if out is None else out
    return _queued(out, lambda: np.matmul(a.view(np.ndarray), b.view(np.ndarray), out=out.view(np.ndarray)))


def subtract(a, b, out=None):
    out = empty(np.broadcast_shapes(a.shape, b.shape), np.result_type(a, b)) if out is None else out
    return _queued(out, lambda: np.subtract(a.view(np.ndarray), b.view(np.ndarray), out=out.view(np.ndarray)))


class linalg:  # noqa: N801  (CuPy's module)
    @staticmethod
    def qr(array):
        k = min(array.shape)
        q, r = empty((array.shape[0], k), array.dtype), empty((k, array.shape[1]), array.dtype)

        def factor():
            q.view(np.ndarray)[...], r.view(np.ndarray)[...] = np.linalg.qr(array.view(np.ndarray))
        _queued(q, factor)
        return q, r


def ElementwiseKernel(inputs, outputs, body, name):  # noqa: N802  (CuPy's name)
    if body != "y = (U)((double)x * factor)":
        raise NotImplementedError(f"the emulated CuPy knows only ringreduce's scaled cast, not {body!r}")

    def scaled_cast(x, factor, y):
        _queued(y, lambda: np.copyto(y.view(np.ndarray), np.asarray(x).astype(np.float64) * factor,
                                     casting="unsafe"))

    return scaled_cast


from cupy import cuda  # noqa: E402  (after ndarray, which cupy.cuda does not need)
