"""torch's autocast with DistributedOptimizer: float16 with a GradScaler, called as torch documents
it (scaler.step(optimizer)) and in Horovod's pattern (synchronize(), unscale_, clip,
skip_synchronize(), scaler.step), bfloat16 without one, and float32; with a GradScaler one step's
loss is infinite on the last rank only, which every rank must skip alike. At 1 rank the job replays the whole batch of
every step (every rank's shard, in rank order). Usage: torch_mixed_precision.py
RANKS_OF_THE_DATA OUT_DIR; writes rank{r}.pt."""

import os
import sys

import torch

import ringreduce.torch as rr

rr.init()
rank, size = rr.rank(), rr.size()
data_ranks, batch, steps, poisoned = int(sys.argv[1]), 4, 6, 3


def shard(r):
    generator = torch.Generator().manual_seed(r)
    return torch.randn(steps * batch, 4, generator=generator), torch.randn(steps * batch, 1, generator=generator)


def batches(r, poison):
    x, y = shard(r)
    for step in range(steps):
        rows = slice(step * batch, (step + 1) * batch)
        scale = float("inf") if poison and step == poisoned and r == data_ranks - 1 else 1.0
        yield x[rows] * scale, y[rows]


def step_batches(poison):
    """This rank's batch of each step, or at 1 rank every rank's side by side."""
    shards = [batches(r, poison) for r in (range(data_ranks) if size == 1 else [rank])]
    for parts in zip(*shards, strict=True):
        yield torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def train(dtype, pattern):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = rr.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                        named_parameters=model.named_parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4) if pattern != "plain" else None
    for x, y in step_batches(poison=scaler is not None):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
            continue
        scaler.scale(loss).backward()
        if pattern == "horovod":
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
        else:
            scaler.step(optimizer)
        scaler.update()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


results = {f"{dtype}-{pattern}": train(getattr(torch, dtype), pattern)
           for dtype, pattern in (("float16", "torch"), ("float16", "horovod"), ("bfloat16", "plain"),
                                  ("float32", "plain"))}
torch.save(results, os.path.join(sys.argv[2], f"rank{rank}.pt"))
