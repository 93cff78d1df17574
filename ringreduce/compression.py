"""Compression for the wire: floating arrays travel as float16 and come back in their own dtype.

It applies to whole fusion buffers: the cast happens while a tensor is copied into the
buffer and while it is copied out, so it costs no extra pass. float16 holds magnitudes up
to 65504; larger values become inf. Scale them down first with prescale_factor (and back up
with postscale_factor), for example by 1/size, which also keeps the sum of all ranks in range.
"""

import functools

import numpy as np


class Compressor:
    """Compression.none: every dtype travels as itself."""

    name = "none"

    def wire_dtype(self, dtype):
        return np.dtype(dtype)


class FP16Compressor(Compressor):
    """Compression.fp16: float32 and float64 travel as float16; other dtypes as themselves."""

    name = "fp16"

    def wire_dtype(self, dtype):
        dtype = np.dtype(dtype)
        return np.dtype(np.float16) if dtype.kind == "f" else dtype


class Compression:
    """The compressors, under the names Horovod uses."""

    none = Compressor()
    fp16 = FP16Compressor()


_ALL = (Compression.none, Compression.fp16)
_BY_NAME = {c.name: c for c in _ALL}


@functools.cache
def wire_dtype(compression, dtype):
    """The dtype that arrays of `dtype` travel as under the compression named `compression`
    (asked for every request, so worked out once per pair)."""
    return _BY_NAME[compression].wire_dtype(dtype)


def check(compression):
    """The compressor's name, or a clear error for anything else."""
    if compression not in _ALL:
        raise ValueError(f"compression must be Compression.none or Compression.fp16, got {compression!r}")
    return compression.name
