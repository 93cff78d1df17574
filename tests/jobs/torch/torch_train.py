"""Data-parallel training with ringreduce.torch on this rank's shard, one run after another in one
job; saves each run's parameters to OUT_DIR/RUN/rankR.pt.
Usage: torch_train.py OUT_DIR RUN... where RUN is OPTIMIZER-PASSES-COMPRESSION[-subclass]

With `subclass`, the training runs through a user's subclass of the distributed optimizer's
class, whose step() counts its calls and calls the distributed step() with super()."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import torch_cases  # noqa: E402

import ringreduce.torch as rr  # noqa: E402


def train(kind, passes, compression, *subclass):
    net = torch_cases.model()
    opt = rr.DistributedOptimizer(torch_cases.optimizer(kind, net.parameters()),
                                  named_parameters=net.named_parameters(), backward_passes_per_step=int(passes),
                                  compression=getattr(rr.Compression, compression))
    if subclass == ("subclass",):
        class Counting(type(opt)):
            steps = 0

            def step(self, closure=None):
                Counting.steps += 1
                return super().step(closure)

        opt.__class__ = Counting
    shard = torch_cases.BATCH // rr.size()
    start = rr.rank() * shard
    piece = shard // int(passes)
    batches = [(start + i * piece, start + (i + 1) * piece) for i in range(int(passes))]
    params = torch_cases.train(net, opt, batches)
    params["steps"] = torch.tensor(getattr(type(opt), "steps", -1))
    return params


rr.init()
out = sys.argv[1]
for run in sys.argv[2:]:
    params = train(*run.split("-"))
    os.makedirs(os.path.join(out, run), exist_ok=True)
    torch.save(params, os.path.join(out, run, f"rank{rr.rank()}.pt"))
