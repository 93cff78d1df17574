"""Compression of TensorFlow tensors for the wire, with Horovod's protocol (ringreduce.numerics.compression):
a compressor of the user's own runs around the collective; the built-in fp16 and bf16 cast inside
the engine instead."""

import tensorflow as tf
from ringreduce.numerics import compression as compressors
from ringreduce.numerics.compression import Compressor, NoneCompressor  # noqa: F401 - Horovod's names, here too


def _casting(to):
    return compressors.casting(to, tf.cast, lambda tensor: tensor.dtype.is_floating)


class FP16Compressor(compressors.FP16Compressor):
    """Floating tensors travel as float16 and come back in their own dtype."""

    compress, decompress = _casting(tf.float16)


class BF16Compressor(compressors.BF16Compressor):
    """Floating tensors travel as bfloat16 and come back in their own dtype."""

    compress, decompress = _casting(tf.bfloat16)


class TopKCompressor(compressors.TopK):
    """Top-k as a tf.IndexedSlices of the flattened tensor, gathered as an embedding's gradient is;
    a vector as it is, averaged."""

    def compress(self, tensor):
        if self.whole(tensor.shape.rank):
            return tensor, tensor.shape
        return self._sparse(tensor)[0], tensor.shape

    def _sparse(self, tensor):
        """(the tf.IndexedSlices of `tensor`'s largest entries, flattened; their indices)."""
        flat = tf.reshape(tensor, [-1])
        count = tensor.shape.num_elements()
        indices = tf.math.top_k(tf.abs(flat), self.count(count), sorted=False).indices
        return tf.IndexedSlices(tf.gather(flat, indices), indices, dense_shape=[count]), indices

    def decompress(self, slices, shape):
        if not isinstance(slices, tf.IndexedSlices):
            return slices
        dense = tf.math.unsorted_segment_sum(slices.values, slices.indices, shape.num_elements())
        return tf.reshape(dense, shape)


class _PerTensorVariables:
    """State per tensor name in tf.Variables, made at a tensor's first call outside any graph (the
    way Keras makes an optimizer's slots), so that a compressor keeps it eagerly, inside tf.function
    and in fit's compiled step alike."""

    def _variable(self, store, name, like):
        if name not in store:
            with tf.init_scope():
                store[name] = tf.Variable(tf.zeros(like.shape, like.dtype), trainable=False)
        return store[name]

    @staticmethod
    def _numpy(store):
        return {name: variable.numpy() for name, variable in store.items()}

    def _load(self, store, arrays):
        for name, array in arrays.items():
            self._variable(store, name, tf.convert_to_tensor(array)).assign(array)


class ErrorFeedback(_PerTensorVariables, compressors.ErrorFeedback):
    """Error feedback (ringreduce.numerics.compression.ErrorFeedback) with its residuals in tf.Variables."""

    def compress(self, tensor, name):
        residual = self._variable(self.residuals, name, tensor)
        corrected = tensor + residual
        compressed, ctx = self.compressor.compress(corrected)
        residual.assign(corrected - self.compressor.decompress(compressed, ctx))
        return compressed, ctx

    def state_dict(self):
        return {"residuals": self._numpy(self.residuals)}

    def load_state_dict(self, state):
        self._load(self.residuals, state["residuals"])


class DGCCompressor(_PerTensorVariables, TopKCompressor):
    """Deep Gradient Compression's momentum correction around top-k, as PyTorch's
    (ringreduce.torch.compression.DGCCompressor): u = momentum u + g, v += u, the `ratio` of v
    largest in magnitude travels and those entries of u and v start again from zero; a vector
    sends its u whole. Use the optimizer without momentum. Its state differs per rank."""

    per_tensor_state = True

    def __init__(self, ratio=0.01, momentum=0.9):
        super().__init__(ratio)
        self.momentum = momentum
        self.velocities, self.accumulated = {}, {}  # name -> tf.Variable u, v of that gradient on this rank

    def compress(self, tensor, name):
        velocity = self._variable(self.velocities, name, tensor)
        velocity.assign(self.momentum * velocity + tensor)
        if self.whole(tensor.shape.rank):
            return velocity.read_value(), tensor.shape
        accumulated = self._variable(self.accumulated, name, tensor)
        accumulated.assign_add(velocity)
        sparse, sent = self._sparse(accumulated.read_value())
        for state in (velocity, accumulated):
            flat = tf.reshape(state, [-1])
            restarted = tf.tensor_scatter_nd_update(flat, sent[:, None], tf.zeros_like(sparse.values))
            state.assign(tf.reshape(restarted, tensor.shape))
        return sparse, tensor.shape

    def state_dict(self):
        return {"velocities": self._numpy(self.velocities), "accumulated": self._numpy(self.accumulated)}

    def load_state_dict(self, state):
        self._load(self.velocities, state["velocities"])
        self._load(self.accumulated, state["accumulated"])


class Compression(compressors.Compression):
    """Horovod's names (none, fp16) and ringreduce's (bf16, topk, dgc, and error_feedback around any
    of these or your own), on TensorFlow tensors."""

    fp16, bf16, topk, dgc, error_feedback = FP16Compressor, BF16Compressor, TopKCompressor, DGCCompressor, ErrorFeedback


def in_engine(compression):
    """The engine's own compression for the built-ins; None for a compressor of the user's own."""
    return compressors.in_engine(compression, FP16Compressor, BF16Compressor)
