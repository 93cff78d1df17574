"""Data-parallel training with ringreduce.torch on this rank's shard; saves the parameters.
Usage: torch_train.py OPTIMIZER PASSES COMPRESSION OUT_DIR [subclass]

With `subclass`, the training runs through a user's subclass of the distributed optimizer's
class, whose step() counts its calls and calls the distributed step() with super()."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch_cases  # noqa: E402

import ringreduce.torch as rr  # noqa: E402

rr.init()
kind, passes, compression, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
net = torch_cases.model()
opt = rr.DistributedOptimizer(torch_cases.optimizer(kind, net.parameters()), named_parameters=net.named_parameters(),
                              backward_passes_per_step=passes, compression=getattr(rr.Compression, compression))
if sys.argv[5:] == ["subclass"]:
    class Counting(type(opt)):
        steps = 0

        def step(self, closure=None):
            Counting.steps += 1
            return super().step(closure)

    opt.__class__ = Counting
shard = torch_cases.BATCH // rr.size()
start = rr.rank() * shard
piece = shard // passes
batches = [(start + i * piece, start + (i + 1) * piece) for i in range(passes)]
params = torch_cases.train(net, opt, batches)
params["steps"] = torch.tensor(getattr(type(opt), "steps", -1))
torch.save(params, os.path.join(out, f"rank{rr.rank()}.pt"))
