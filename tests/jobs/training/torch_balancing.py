"""Load-balanced training under real ranks, one mode after another in one job: every rank sleeps
for each sample it takes (2 ms; the last rank 6 ms, standing for a device three times slower), so
the ranks' speeds have a known ratio beside which the small model's own computation is negligible
(at 1 and 3 ms, CI once measured the set's split at 0.69 where 0.75 is due).
Each rank saves, per step, the dataset indices it took and the balancer's shares, and its final
parameters, to OUT_DIR/MODE/rankR.pt. Usage: torch_balancing.py OUT_DIR MODE...

plain: every rank, uncompressed.
fp16: every rank, gradients as float16.
powersgd: every rank, PowerSGD of a rank that holds each gradient whole (so exact).
syncbn: every rank, the model with a SyncBatchNorm after its first layer.
set: a process set of the first two ranks balances among them (the last rank, the slow one, is
  outside it and does nothing); there the second rank is the slow one.
"""

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import torch_cases  # noqa: E402

import ringreduce.torch as rr  # noqa: E402

SAMPLES, BATCH, EPOCHS = 200, 48, 3  # 5 batches an epoch, the last one of 8 samples
rr.init()
out = sys.argv[1]
generator = torch.Generator().manual_seed(2)
dataset = TensorDataset(torch.randn(SAMPLES, torch_cases.FEATURES, generator=generator),
                        torch.randint(0, torch_cases.CLASSES, (SAMPLES,), generator=generator),
                        torch.arange(SAMPLES))  # each sample's index, to see who took which
# The set of the first two ranks, made by every rank (the last one then stays out of it).
pair = rr.add_process_set([0, 1]) if "set" in sys.argv[2:] else None


COMPRESSION = {"fp16": rr.Compression.fp16,
               "powersgd": rr.PowerSGD(matrix_approximation_rank=16, start_powerSGD_iter=0, min_compression_rate=0)}


def train(mode):
    process_set = pair if mode == "set" else rr.global_process_set
    if not process_set.included():
        return None
    slow = process_set.rank() == process_set.size() - 1
    balancer = rr.LoadBalancer(BATCH, interval=3, damping=0.5, process_set=process_set)
    sampler = rr.BalancedBatchSampler(dataset, balancer, shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_sampler=sampler)
    net = torch_cases.model(rr.SyncBatchNorm(16, process_set=process_set, load_balancer=balancer)
                            if mode == "syncbn" else None)
    opt = rr.DistributedOptimizer(torch_cases.optimizer("sgd", net.parameters()),
                                  named_parameters=net.named_parameters(), process_set=process_set,
                                  compression=COMPRESSION.get(mode, rr.Compression.none),
                                  load_balancer=balancer)
    taken, shares, batches = [], [], []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        batches += [batch.tolist() for batch in sampler.global_batches()]
        for features, labels, indices in loader:
            time.sleep((0.006 if slow else 0.002) * len(labels))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(features), labels).backward()
            opt.step()
            taken.append(indices.tolist())
            shares.append(balancer.shares.tolist())
    return {"taken": taken, "shares": shares, "global": batches,
            "parameters": {name: p.detach().clone() for name, p in net.named_parameters()}}


for mode in sys.argv[2:]:
    result = train(mode)
    if result is not None:
        os.makedirs(os.path.join(out, mode), exist_ok=True)
        torch.save(result, os.path.join(out, mode, f"rank{rr.rank()}.pt"))
