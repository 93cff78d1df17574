"""Compression for the wire, with Horovod's protocol: a compressor's `compress(tensor)` gives
`(compressed, context)` and `decompress(compressed, context)` the tensor back.

The built-ins fp16 and bf16 (floating arrays travel as float16 or bfloat16 and come back in their
own dtype) are applied by the engine itself, to whole fusion buffers: the cast happens while a
tensor is copied into the buffer and while it is copied out, so it costs no extra pass. float16
holds magnitudes up to 65504; larger values become inf: scale them down first with
prescale_factor (and back up with postscale_factor), for example by 1/size, which also keeps the
sum of all ranks in range. bfloat16 has float32's range and 8 bits of precision (float16 has 11):
no overflow, coarser values. numpy has no bfloat16; ml_dtypes' (which TensorFlow and JAX use)
casts and adds it. A compressor of the user's own runs around the collective in the bindings.
"""

import functools
from typing import TypeAlias

import numpy as np


@functools.cache
def bfloat16():
    """numpy's dtype for bfloat16, from ml_dtypes, imported on first use: the import takes 0.8 s,
    which every rank would otherwise pay at start-up."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


class Compressor:
    """Interface for compressing and decompressing a tensor; subclass it with your own. The base
    compresses nothing."""

    name = "none"  # what the engine applies itself, for the built-ins
    wire = None  # the dtype floating arrays travel as, for the built-in casts (or a function giving it)

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor

    @classmethod
    def wire_dtype(cls, dtype):
        dtype = np.dtype(dtype)
        if cls.wire is None or dtype.kind != "f":
            return dtype
        return cls.wire() if callable(cls.wire) else cls.wire


def casting(to, convert, is_floating):
    """compress and decompress (as static methods) of a compressor whose floating tensors travel as
    `to` (a dtype, or a function that gives it when first needed): `convert(tensor, dtype)` casts,
    `is_floating(tensor)` tells which to cast. Each call makes functions of their own, by which
    in_engine tells the built-ins apart."""
    def compress(tensor):
        return (convert(tensor, to() if callable(to) else to) if is_floating(tensor) else tensor), tensor.dtype

    def decompress(tensor, ctx):
        return convert(tensor, ctx)

    return staticmethod(compress), staticmethod(decompress)


def _numpy_casting(to):
    return casting(to, lambda array, dtype: array.astype(dtype, copy=False), lambda array: array.dtype.kind == "f")


class NoneCompressor(Compressor):
    """Every dtype travels as itself."""


class FP16Compressor(Compressor):
    """Floating arrays travel as float16; other dtypes as themselves."""

    name, wire = "fp16", np.dtype(np.float16)
    compress, decompress = _numpy_casting(wire)


class BF16Compressor(Compressor):
    """Floating arrays travel as bfloat16; other dtypes as themselves."""

    name, wire = "bf16", staticmethod(bfloat16)
    compress, decompress = _numpy_casting(bfloat16)


class ErrorFeedback(Compressor):
    """A lossy compressor with error feedback: what the wire lost of a tensor's contribution
    (the tensor, corrected, less what its compressed form decompresses to) is kept and added to
    that tensor's next one, so that over the steps nothing is lost, only delayed. Works on any
    tensor type with + and - (numpy, CuPy, torch, TensorFlow).

    Its state is per tensor and differs per rank: `compress` takes the tensor's `name` (the
    optimizers pass it to compressors whose `per_tensor_state` is true); `state_dict()` and
    `load_state_dict()` give and take the residuals."""

    per_tensor_state = True

    def __init__(self, compressor):
        self.compressor = compressor
        self.residuals = {}  # name -> what the wire lost of that tensor's last contribution

    def compress(self, tensor, name):
        residual = self.residuals.get(name)
        corrected = tensor if residual is None else tensor + residual
        compressed, ctx = self.compressor.compress(corrected)
        self.residuals[name] = corrected - self.compressor.decompress(compressed, ctx)
        return compressed, ctx

    def decompress(self, tensor, ctx):
        return self.compressor.decompress(tensor, ctx)

    @property
    def gathers(self):
        """Whether what the wrapped compressor makes is combined by allgather (top-k)."""
        return getattr(self.compressor, "gathers", False)

    def state_dict(self):
        return {"residuals": dict(self.residuals)}

    def load_state_dict(self, state):
        self.residuals = dict(state["residuals"])


class TopK(Compressor):
    """Top-k sparsification, the part the frameworks share: only the `ratio` of a tensor's entries
    largest in magnitude travel (at least one), as indices and values, which the ranks gather and
    add up rather than reduce in place. Wrap it in error feedback so that the rest is sent later,
    not lost. Each binding's subclass makes its own sparse form.

    Vectors (biases, normalisation scales) travel whole and are averaged, as in DGC's reference
    code: they are a small share of a model's bytes, and 1 % of a few dozen entries is one entry
    a step, so they would hardly move."""

    gathers = True  # what it compresses to is combined by allgather

    def __init__(self, ratio=0.01):
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {ratio}")
        self.ratio = ratio

    def count(self, size):
        """How many of `size` entries travel."""
        return max(1, round(size * self.ratio))

    @staticmethod
    def whole(ndim):
        """Does a tensor of `ndim` dimensions travel whole (averaged, not sparsified)?"""
        return ndim < 2


# What `compression=` takes: a compressor class (Horovod's style, static methods) or an instance.
CompressorLike: TypeAlias = Compressor | type[Compressor]


class Compression:
    """The compressors, under the names Horovod uses (bf16 and error_feedback are ringreduce's)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    error_feedback = ErrorFeedback


_ALL = (Compression.none, Compression.fp16, Compression.bf16)
_BY_NAME = {c.name: c for c in _ALL}


@functools.cache
def wire_dtype(compression, dtype):
    """The dtype that arrays of `dtype` travel as under the compression named `compression`
    (asked for every request, so worked out once per pair)."""
    return _BY_NAME[compression].wire_dtype(dtype)


def compress(compressor, tensor, name):
    """compressor.compress(tensor), given the tensor's name where the compressor keeps state per
    tensor (its `per_tensor_state`: ErrorFeedback, or a compressor of your own)."""
    if getattr(compressor, "per_tensor_state", False):
        return compressor.compress(tensor, name)
    return compressor.compress(tensor)


def compress_all(compressor, tensors, names):
    """[(compressed, ctx)] of each tensor; `names` (None for a call without one) go to a compressor
    with per-tensor state, which cannot do without them."""
    if getattr(compressor, "per_tensor_state", False) and None in names:
        raise ValueError(f"{type(compressor).__name__} keeps state per tensor: give the call a name, the same at "
                         "every step")
    return [compress(compressor, tensor, name) for tensor, name in zip(tensors, names, strict=True)]


def in_engine(compressor, fp16, bf16):
    """The engine's own compression for a binding's compressor when it is a built-in (none, or
    that binding's `fp16` or `bf16`, by their compress and decompress), else None: a compressor of
    the user's own, whose compress runs before the collective and decompress after. Anything
    without compress and decompress is an error."""
    for built_in, engine_form in ((NoneCompressor, Compression.none), (fp16, Compression.fp16),
                                  (bf16, Compression.bf16)):
        if compressor.compress is built_in.compress and compressor.decompress is built_in.decompress:
            return engine_form
    if not (callable(getattr(compressor, "compress", None)) and callable(getattr(compressor, "decompress", None))):
        raise ValueError(f"compression must have compress(tensor) and decompress(tensor, ctx), got {compressor!r}")
    return None


def check(compression):
    """The compressor's name, or a clear error for anything else."""
    if compression not in _ALL:
        raise ValueError(f"compression must be Compression.none, Compression.fp16 or Compression.bf16, got "
                         f"{compression!r}")
    return compression.name
