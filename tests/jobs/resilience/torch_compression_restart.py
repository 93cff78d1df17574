"""Training with compressors whose state differs per rank, checkpointed after step 3: error
feedback around fp16, and PowerSGD (rank 1, one plain step), one after the other in one job.
Usage: torch_compression_restart.py CHECKPOINT_DIR OUT_DIR

For each: a run through steps 0-7 that saves after step 3 ("through"); a fresh model and optimizer
restored from that checkpoint and trained on to step 7 ("resumed"); and, once rank 1's per-rank
file is gone, the same again ("afresh"). Saves each final state to OUT_DIR/KIND-WHICH-rankR.pt and
the checkpoint's file names to OUT_DIR/KIND-files.txt."""

import os
import sys

import torch

import ringreduce.torch as rr

directory, out = sys.argv[1:3]
rr.init()


def train(kind, restore):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    compression = (rr.Compression.error_feedback(rr.Compression.fp16) if kind == "error-feedback"
                   else rr.PowerSGD(matrix_approximation_rank=1, start_powerSGD_iter=1))
    optimizer = rr.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                        named_parameters=model.named_parameters(), compression=compression)
    first = rr.checkpoint.restore(os.path.join(directory, kind), model, optimizer)["step"] + 1 if restore else 0
    for step in range(first, 8):
        generator = torch.Generator().manual_seed(1000 * step + rr.rank())
        x = torch.randn(8, 12, generator=generator) * 3.3  # values float16 rounds
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), torch.randint(0, 3, (8,), generator=generator)).backward()
        optimizer.step()
        if step == 3 and not restore:
            rr.checkpoint.save(os.path.join(directory, kind), step, model, optimizer)
    return model.state_dict()


for kind in ("error-feedback", "powersgd"):
    results = {"through": train(kind, restore=False), "resumed": train(kind, restore=True)}
    rr.barrier()
    if rr.rank() == 0:
        with open(os.path.join(out, f"{kind}-files.txt"), "w") as f:
            f.write("\n".join(sorted(os.listdir(os.path.join(directory, kind)))))
    rr.barrier()
    if rr.rank() == 1:
        os.unlink(os.path.join(directory, kind, "checkpoint-000000003.rank1-of-2.rr"))
    rr.barrier()
    results["afresh"] = train(kind, restore=True)
    for which, state in results.items():
        torch.save(state, os.path.join(out, f"{kind}-{which}-rank{rr.rank()}.pt"))
