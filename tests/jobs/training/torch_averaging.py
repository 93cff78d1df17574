"""Fewer or later synchronisations under real ranks: each mode trains torch_cases' model on this
rank's shard and saves the parameters after every step to OUT_DIR/MODE/rankR.pt, one mode after
another in one job. Usage: torch_averaging.py OUT_DIR MODE...

stale: DistributedOptimizer(staleness=1), SGD with momentum (weight prediction on, the default).
stale-plain: as stale, with weight_prediction=False.
stale-loaded: as stale; before step 3 the model loads the parameters it had after step 1 (as from a
  checkpoint), which become its true weights.
local: PostLocalSGDOptimizer with PeriodicModelAverager(period=2, warmup_steps=2), optimizer
  state averaged too.
local-bf16: PeriodicModelAverager(period=2, warmup_steps=2, compression=bf16), optimizer state not
  averaged: the change since the last average travels as bfloat16.
diloco: as local, with an outer Nesterov step at each average.
hierarchical: HierarchicalModelAverager({1: 2, 2: 4}), no warm-up (4 ranks).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import torch_cases  # noqa: E402

import ringreduce.torch as rr  # noqa: E402

rr.init()
out = sys.argv[1]


def optimizer(mode, net):
    local = torch_cases.optimizer("sgd", net.parameters())
    if mode.startswith("stale"):
        return rr.DistributedOptimizer(local, named_parameters=net.named_parameters(), staleness=1,
                                       weight_prediction=mode != "stale-plain")
    if mode == "local":
        return rr.PostLocalSGDOptimizer(local, rr.PeriodicModelAverager(period=2, warmup_steps=2),
                                        average_optimizer_state=True)
    if mode == "local-bf16":
        return rr.PostLocalSGDOptimizer(local, rr.PeriodicModelAverager(period=2, warmup_steps=2,
                                                                        compression=rr.Compression.bf16))
    if mode == "diloco":
        return rr.PostLocalSGDOptimizer(local, rr.PeriodicModelAverager(
            period=2, warmup_steps=2,
            outer_optimizer=lambda p: torch.optim.SGD(p, lr=0.7, momentum=0.9, nesterov=True)))
    return rr.PostLocalSGDOptimizer(local, rr.HierarchicalModelAverager({1: 2, 2: 4}))


inputs, labels = torch_cases.data()
shard = torch_cases.BATCH // rr.size()
mine = slice(rr.rank() * shard, (rr.rank() + 1) * shard)
for mode in sys.argv[2:]:
    net = torch_cases.model()
    opt = optimizer(mode, net)
    saved, wire = {}, []
    for step in range(torch_cases.STEPS):
        if mode == "stale-loaded" and step == 3:
            net.load_state_dict({name: saved[f"1.{name}"] for name, _ in net.named_parameters()})
        before = rr.engine_stats()["bytes"]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(inputs[mine]), labels[mine]).backward()
        opt.step()
        wire.append(rr.engine_stats()["bytes"] - before)
        saved.update({f"{step}.{name}": p.detach().clone() for name, p in net.named_parameters()})
    if mode.startswith("stale"):
        opt.synchronize()  # the last step's average, still in flight; the true weights back
        saved.update({f"final.{name}": p.detach().clone() for name, p in net.named_parameters()})
    saved["wire"] = torch.tensor(wire)  # bytes this rank put into the engine's collectives, per step
    os.makedirs(os.path.join(out, mode), exist_ok=True)
    torch.save(saved, os.path.join(out, mode, f"rank{rr.rank()}.pt"))
