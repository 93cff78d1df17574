"""Compression of torch tensors for the wire, with Horovod's protocol (ringreduce.numerics.compression):
a compressor of the user's own runs around the collective; the built-in fp16 and bf16 cast inside
the engine instead (the same values, in the same pass that packs the fusion buffer)."""

import numpy as np

import torch
from ringreduce.numerics import compression as compressors
from ringreduce.numerics.compression import Compressor, NoneCompressor  # noqa: F401 - Horovod's names, here too


def _casting(to):
    return compressors.casting(to, lambda tensor, dtype: tensor.to(dtype),
                               lambda tensor: tensor.dtype.is_floating_point)


class FP16Compressor(compressors.FP16Compressor):
    """Floating tensors travel as float16 and come back in their own dtype."""

    compress, decompress = _casting(torch.float16)


class BF16Compressor(compressors.BF16Compressor):
    """Floating tensors travel as bfloat16 and come back in their own dtype."""

    compress, decompress = _casting(torch.bfloat16)


class TopKCompressor(compressors.TopK):
    """Top-k as a sparse COO tensor of the flattened tensor, gathered (indices and values); a
    vector as it is, averaged."""

    def compress(self, tensor):
        if self.whole(tensor.dim()):
            return tensor, tensor.shape
        return self._sparse(tensor.reshape(-1))[0], tensor.shape

    def _sparse(self, flat):
        """(the sparse tensor of `flat`'s largest entries, their indices)."""
        indices = _largest(flat.detach().abs(), self.count(flat.numel()))
        return torch.sparse_coo_tensor(indices.unsqueeze(0), flat[indices], flat.shape, check_invariants=False), indices

    def decompress(self, tensor, shape):
        return (tensor.to_dense() if tensor.is_sparse else tensor).reshape(shape)


class DGCCompressor(TopKCompressor):
    """Deep Gradient Compression's momentum correction (Lin et al., 2018) around top-k: each rank
    keeps the momentum of its own gradients (u = momentum u + g) and accumulates it (v += u); the
    `ratio` of v largest in magnitude travels, and those entries of u and v start again from zero.
    The momentum is applied here, before sparsification, so use the optimizer without momentum; a
    vector sends its u whole, which is momentum SGD's step. Its state differs per rank
    (checkpoints keep it per rank)."""

    per_tensor_state = True

    def __init__(self, ratio=0.01, momentum=0.9):
        super().__init__(ratio)
        self.momentum = momentum
        self.velocities, self.accumulated = {}, {}  # name -> u, v of that gradient on this rank

    def compress(self, tensor, name):
        velocity = self.velocities.get(name)
        velocity = tensor.detach().clone() if velocity is None else velocity.mul_(self.momentum).add_(tensor)
        self.velocities[name] = velocity
        if self.whole(tensor.dim()):
            return velocity.clone(), tensor.shape
        accumulated = self.accumulated.get(name)
        accumulated = velocity.clone() if accumulated is None else accumulated.add_(velocity)
        self.accumulated[name] = accumulated
        sparse, sent = self._sparse(accumulated.view(-1))
        velocity.view(-1)[sent] = 0
        accumulated.view(-1)[sent] = 0
        return sparse, tensor.shape

    def state_dict(self):
        return {"velocities": dict(self.velocities), "accumulated": dict(self.accumulated)}

    def load_state_dict(self, state):
        self.velocities, self.accumulated = dict(state["velocities"]), dict(state["accumulated"])


def _largest(magnitudes, k):
    """The indices of the k largest of `magnitudes`, in no order: numpy's partition on the CPU
    (1 % of 3.1 M floats: 16 ms, torch.topk 60 ms), torch.topk on a GPU."""
    if magnitudes.is_cuda:
        return torch.topk(magnitudes, k, sorted=False).indices
    if magnitudes.dtype not in (torch.float32, torch.float64):
        magnitudes = magnitudes.float()
    return torch.from_numpy(np.argpartition(magnitudes.numpy(), -k)[-k:])


class Compression(compressors.Compression):
    """Horovod's names (none, fp16) and ringreduce's (bf16, topk, dgc, and error_feedback around any
    of these or your own), on torch tensors."""

    fp16, bf16, topk, dgc = FP16Compressor, BF16Compressor, TopKCompressor, DGCCompressor


def in_engine(compression):
    """The engine's own compression for the built-ins; None for a compressor of the user's own."""
    return compressors.in_engine(compression, FP16Compressor, BF16Compressor)
