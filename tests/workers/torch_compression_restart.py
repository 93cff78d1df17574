"""Training with compressors whose state differs per rank, checkpointed after step 3: error
feedback around fp16, and PowerSGD (rank 1, one plain step), one after the other in one job.
Usage: torch_compression_restart.py START CHECKPOINT_DIR OUT_DIR

START 0 trains steps 0-7 and saves after step 3; START restore restores the newest checkpoint and
trains on to step 7. Saves the final parameters to OUT_DIR/KIND-rankR.pt, with checkpoints in
CHECKPOINT_DIR/KIND."""

import os
import sys

import torch

import ringreduce.torch as rr

start, directory, out = sys.argv[1:4]
rr.init()


def train(kind):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    compression = (rr.Compression.error_feedback(rr.Compression.fp16) if kind == "error-feedback"
                   else rr.PowerSGD(matrix_approximation_rank=1, start_powerSGD_iter=1))
    optimizer = rr.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                        named_parameters=model.named_parameters(), compression=compression)
    first = 0
    if start == "restore":
        first = rr.checkpoint.restore(os.path.join(directory, kind), model, optimizer)["step"] + 1
    for step in range(first, 8):
        generator = torch.Generator().manual_seed(1000 * step + rr.rank())
        x = torch.randn(8, 12, generator=generator) * 3.3  # values float16 rounds
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), torch.randint(0, 3, (8,), generator=generator)).backward()
        optimizer.step()
        if step == 3:
            rr.checkpoint.save(os.path.join(directory, kind), step, model, optimizer)
    torch.save(model.state_dict(), os.path.join(out, f"{kind}-rank{rr.rank()}.pt"))


for kind in ("error-feedback", "powersgd"):
    train(kind)
