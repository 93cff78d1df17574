"""An emulated CuPy for machines without a GPU, put on a job's PYTHONPATH by the tests: its
arrays keep their values in host memory but are not numpy arrays (numpy refuses to take one as
its own, as with CuPy, and mpi4py reaches their memory only through __cuda_array_interface__),
its streams queue kernels, copies and NCCL calls until something waits for them (cuda.Stream),
its "device" copies are memmoves, its kernels are the same formulas run by numpy, and its NCCL
is MPI.

It lets the GPU path run end to end under the real rrun and MPI (device tagging, the device
executor, the staging transport's copies and chunks); it says nothing about CUDA itself, which
tests/jobs/gpu/test_gpu.py checks on a machine with a GPU.
"""


import numpy as np
from numpy import bool_, float16, float32, float64, int8, int16, int32, int64, uint8  # noqa: F401
from numpy.lib.mixins import NDArrayOperatorsMixin

__version__ = "emulated"


class ndarray(NDArrayOperatorsMixin):  # noqa: N801  (CuPy's name)
    """A device array: a numpy array of host memory (`_memory`, a view where this is one) known as
    device memory of its GPU (cuda.check_device_pointer). As with CuPy, numpy will not convert it
    (np.asarray raises: use get()), host arrays do not mix with it in arithmetic (they may be
    assigned into it), and its memory has no buffer protocol. What numpy would do to it
    (operators, ufuncs, numpy's functions, assignments, fill, get) runs at once, after the work
    queued on the current stream (cuda.Stream), as a kernel queued there would."""

    __array_priority__ = 100

    def __init__(self, memory, device, stream):
        self._memory, self._device, self._stream = memory, device, stream

    # ---- what numpy may and may not do with it ----

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
                        "NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _after_current_stream()
        if out is not None:
            kwargs["out"] = tuple(_memory_of(value) for value in out)
        result = getattr(ufunc, method)(*map(_memory_of, inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return self._result(result)

    def __array_function__(self, func, types, args, kwargs):
        _after_current_stream()
        return self._result(func(*_unwrapped(args), **_unwrapped(kwargs)))

    def _result(self, result):
        """A numpy result of an operation on device arrays, as CuPy gives it: a new device array."""
        if isinstance(result, tuple):
            return tuple(self._result(part) for part in result)
        return _on_device(result) if isinstance(result, np.ndarray) else result

    @property
    def __cuda_array_interface__(self):
        memory = self._memory
        return {"shape": memory.shape, "typestr": memory.dtype.str, "descr": memory.dtype.descr,
                "strides": None if memory.flags.c_contiguous else memory.strides,
                "data": (memory.ctypes.data, False), "version": 3}

    # ---- views: the same memory, device and stream ----

    def _view(self, memory):
        return ndarray(memory, self._device, self._stream)

    def __getitem__(self, key):
        key = _unwrapped(key)
        part = self._memory[key]
        if not isinstance(part, np.ndarray):  # one element: CuPy gives a 0-d array of it
            part = self._memory[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
        return self._view(part)

    def __setitem__(self, key, value):  # a host value is copied in, as CuPy copies one
        _after_current_stream()
        self._memory[_unwrapped(key)] = _unwrapped(value)

    def reshape(self, *shape, **kwargs):
        return self._view(self._memory.reshape(*shape, **kwargs))

    def view(self, dtype):
        return self._view(self._memory.view(dtype))

    def ravel(self):
        return self._view(self._memory.ravel()) if self._memory.flags.c_contiguous else self.copy().ravel()

    def transpose(self, *axes):
        return self._view(self._memory.transpose(*axes))

    @property
    def T(self):  # noqa: N802  (numpy's name)
        return self._view(self._memory.T)

    def __len__(self):
        return len(self._memory)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # ---- what it is ----

    shape = property(lambda self: self._memory.shape)
    dtype = property(lambda self: self._memory.dtype)
    size = property(lambda self: self._memory.size)
    ndim = property(lambda self: self._memory.ndim)
    nbytes = property(lambda self: self._memory.nbytes)
    itemsize = property(lambda self: self._memory.itemsize)
    strides = property(lambda self: self._memory.strides)
    flags = property(lambda self: self._memory.flags)

    @property
    def data(self):
        return _Pointer(self._memory.ctypes.data)

    @property
    def device(self):
        return cuda.Device(self._device)

    def __repr__(self):
        return f"emulated cupy.ndarray({self._memory!r}, device={self._device})"

    # ---- new arrays and host copies ----

    def astype(self, dtype, copy=True):
        _after_current_stream()
        return _on_device(self._memory.astype(dtype))

    def copy(self):
        _after_current_stream()
        return _on_device(self._memory.copy())

    def fill(self, value):
        _after_current_stream()
        self._memory.fill(value)

    def set(self, values):
        self[...] = values

    def get(self, out=None):
        _after_current_stream()
        if out is None:
            return self._memory.copy()
        out[...] = self._memory
        return out

    def item(self):
        _after_current_stream()
        return self._memory.item()

    def tolist(self):
        _after_current_stream()
        return self._memory.tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def sum(self, *args, **kwargs):
        return np.sum(self, *args, **kwargs)

    def max(self, *args, **kwargs):
        return np.max(self, *args, **kwargs)

    def min(self, *args, **kwargs):
        return np.min(self, *args, **kwargs)


class _Pointer:
    def __init__(self, ptr):
        self.ptr = ptr


def _memory_of(value):
    """A device array's memory, for numpy to compute on; a host array is refused, as CuPy refuses
    to mix one with its arrays."""
    if isinstance(value, ndarray):
        return value._memory
    if isinstance(value, np.ndarray) and value.ndim > 0:
        raise TypeError(f"Unsupported type {type(value)}: a host array does not mix with device arrays")
    return value


def _unwrapped(value):
    """`value` with every device array in it (in lists, tuples and dicts too) replaced by its memory."""
    if isinstance(value, ndarray):
        return value._memory
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrapped(part) for part in value)
    if isinstance(value, dict):
        return {key: _unwrapped(part) for key, part in value.items()}
    return value


def _after_current_stream():
    cuda.get_current_stream().synchronize()


def _queued(result, compute):
    """`result`, to be filled by `compute()` when the current stream's work reaches it."""
    def work():
        compute()
    cuda.get_current_stream().enqueue(work)
    return result


def _on_device(memory):
    """A new device array of host memory `memory` (a numpy array), on the calling thread's current
    device, its memory known as device memory (cuda.check_device_pointer) while it lives."""
    cuda.make_context()
    cuda.allocated(memory)
    return ndarray(memory, cuda.current(), cuda.get_current_stream().ptr)


def empty(shape, dtype=float):
    return _on_device(np.empty(shape, dtype))


def zeros(shape, dtype=float):
    return _on_device(np.zeros(shape, dtype))


def empty_like(array):
    return _on_device(np.empty(array.shape, array.dtype))


def full(shape, value, dtype=None):
    return _on_device(np.full(shape, value, dtype))


def eye(n, dtype=float):
    return _on_device(np.eye(n, dtype=dtype))


def asnumpy(array):
    return array.get() if isinstance(array, ndarray) else np.array(array, copy=True)


def asarray(values, dtype=None):
    if isinstance(values, ndarray):
        return values if dtype is None or values.dtype == dtype else values.astype(dtype)
    return _on_device(np.array(values, dtype=dtype, copy=True))


def array(values, dtype=None, order="C", copy=True):
    if isinstance(values, ndarray):
        _after_current_stream()
        values = values._memory
    return _on_device(np.array(values, dtype=dtype, order=order, copy=True))


def all(array):  # noqa: A001  (CuPy's name)
    return np.all(array)


def matmul(a, b, out=None):
    out = empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]),
                np.result_type(a.dtype, b.dtype)) if out is None else out
    return _queued(out, lambda: np.matmul(a._memory, b._memory, out=out._memory))


def subtract(a, b, out=None):
    out = empty(np.broadcast_shapes(a.shape, b.shape), np.result_type(a.dtype, b.dtype)) if out is None else out
    return _queued(out, lambda: np.subtract(a._memory, b._memory, out=out._memory))


class linalg:  # noqa: N801  (CuPy's module)
    @staticmethod
    def qr(array):
        k = min(array.shape)
        q, r = empty((array.shape[0], k), array.dtype), empty((k, array.shape[1]), array.dtype)

        def factor():
            q._memory[...], r._memory[...] = np.linalg.qr(array._memory)
        _queued(q, factor)
        return q, r


def ElementwiseKernel(inputs, outputs, body, name):  # noqa: N802  (CuPy's name)
    if body != "y = (U)((double)x * factor)":
        raise NotImplementedError(f"the emulated CuPy knows only ringreduce's scaled cast, not {body!r}")

    def scaled_cast(x, factor, y):
        _queued(y, lambda: np.copyto(y._memory, x._memory.astype(np.float64) * factor, casting="unsafe"))

    return scaled_cast


from cupy import cuda  # noqa: E402  (after ndarray, which cupy.cuda does not need)
