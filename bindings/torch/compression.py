"""Compression of torch tensors for the wire, with Horovod's protocol (ringreduce.compression):
a compressor of the user's own runs around the collective; the built-in fp16 and bf16 cast inside
the engine instead (the same values, in the same pass that packs the fusion buffer)."""

import torch
from ringreduce import compression as wire
from ringreduce.compression import Compressor, NoneCompressor  # noqa: F401 - Horovod's names, here too


class FP16Compressor(wire.FP16Compressor):
    """Floating tensors travel as float16 and come back in their own dtype."""

    @staticmethod
    def compress(tensor):
        return (tensor.to(torch.float16) if tensor.dtype.is_floating_point else tensor), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx)


class BF16Compressor(wire.BF16Compressor):
    """Floating tensors travel as bfloat16 and come back in their own dtype."""

    @staticmethod
    def compress(tensor):
        return (tensor.to(torch.bfloat16) if tensor.dtype.is_floating_point else tensor), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def in_engine(compression):
    """The engine's own compression for the built-ins; None for a compressor of the user's own."""
    return wire.in_engine(compression, FP16Compressor, BF16Compressor)
