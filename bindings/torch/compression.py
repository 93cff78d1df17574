"""Compression of torch tensors for the wire, with Horovod's protocol: a compressor's
`compress(tensor)` gives `(compressed, context)` and `decompress(compressed, context)` the
tensor back. A compressor of the user's own runs around the collective; the built-in fp16 casts
inside the engine instead (the same values, in the same pass that packs the fusion buffer).
"""

import torch
from ringreduce import compression as wire


class Compressor:
    """Interface for compressing and decompressing a tensor; subclass it with your own."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class NoneCompressor(Compressor):
    """Every tensor travels as it is."""


class FP16Compressor(Compressor):
    """Floating tensors travel as float16 and come back in their own dtype."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None or tensor.dtype == ctx else tensor.to(ctx)


class Compression:
    """The built-in compressors, under Horovod's names."""

    none = NoneCompressor
    fp16 = FP16Compressor


def in_engine(compression):
    """The compression the engine applies itself for `compression` (the built-ins: theirs), or None
    for a compressor of the user's own, whose compress and decompress run around the collective."""
    built_in = {NoneCompressor: wire.Compression.none, FP16Compressor: wire.Compression.fp16}
    for compressor, engine_form in built_in.items():
        if compression.compress is compressor.compress and compression.decompress is compressor.decompress:
            return engine_form
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise ValueError(f"compression must have compress(tensor) and decompress(tensor, ctx), got {compression!r}")
    return None
