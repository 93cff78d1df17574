"""The CuPy kernel of the device path, and whether it runs on bfloat16 here.

One element-wise kernel does every cast and scaling on the GPU: y = x * factor in y's dtype, in
one pass (prescale and the cast to a compressed wire on the way in; the cast back, the average
and the postscale on the way out). bfloat16 arrays need CuPy 14 with ml_dtypes installed, and
its bfloat16 kernels compile only with CUDA 12.2's headers or later, so whether this GPU can
carry them is asked once, by running the kernel on a bfloat16 array.
"""

import functools

import numpy as np

from ringreduce.numerics import compression

_SCALED_CAST = ("T x, float64 factor", "U y", "y = (U)((double)x * factor)", "ringreduce_scaled_cast")


@functools.cache
def scaled_cast(cupy):
    """scaled_cast(cupy)(x, factor, y): y = x * factor, cast to y's dtype, on the current stream."""
    return cupy.ElementwiseKernel(*_SCALED_CAST)


@functools.cache
def bfloat16_unavailable(cupy) -> str | None:
    """Why bfloat16 arrays cannot travel on the GPU here, or None where they can (the scaled cast
    runs on them and gives the right values). Asked on the current device."""
    try:
        bfloat16 = compression.bfloat16()
        probe = cupy.full(2, 3, dtype=bfloat16)
        scaled_cast(cupy)(probe, 0.5, probe)
        if probe.get().astype(np.float32).tolist() != [1.5, 1.5]:
            return "CuPy's bfloat16 kernel gave wrong values"
    except Exception as error:  # CuPy < 14 (no such dtype), no ml_dtypes, nvrtc < 12.2: a compile error
        first_line = str(error).splitlines()[0] if str(error) else ""
        return f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__
    return None
