"""Compression of TensorFlow tensors for the wire, with Horovod's protocol (ringreduce.compression):
a compressor of the user's own runs around the collective; the built-in fp16 and bf16 cast inside
the engine instead."""

import tensorflow as tf
from ringreduce import compression as wire
from ringreduce.compression import Compressor, NoneCompressor  # noqa: F401 - Horovod's names, here too


def _casting(to):
    return wire.casting(to, tf.cast, lambda tensor: tensor.dtype.is_floating)


class FP16Compressor(wire.FP16Compressor):
    """Floating tensors travel as float16 and come back in their own dtype."""

    compress, decompress = _casting(tf.float16)


class BF16Compressor(wire.BF16Compressor):
    """Floating tensors travel as bfloat16 and come back in their own dtype."""

    compress, decompress = _casting(tf.bfloat16)


class TopKCompressor(wire.TopK):
    """Top-k as a tf.IndexedSlices of the flattened tensor, gathered as an embedding's gradient is.
    Error feedback around it works eagerly."""

    def compress(self, tensor):
        flat = tf.reshape(tensor, [-1])
        count = tensor.shape.num_elements()
        indices = tf.math.top_k(tf.abs(flat), self.count(count), sorted=False).indices
        return tf.IndexedSlices(tf.gather(flat, indices), indices, dense_shape=[count]), tensor.shape

    def decompress(self, slices, shape):
        dense = tf.math.unsorted_segment_sum(slices.values, slices.indices, shape.num_elements())
        return tf.reshape(dense, shape)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    topk = TopKCompressor
    error_feedback = wire.ErrorFeedback  # around any of these (on this framework's tensors) or your own


def in_engine(compression):
    """The engine's own compression for the built-ins; None for a compressor of the user's own."""
    return wire.in_engine(compression, FP16Compressor, BF16Compressor)
