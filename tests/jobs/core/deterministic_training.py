"""Training whose every step's gradients are averaged in float32 across the ranks: an MLP with
DistributedOptimizer, each rank on its own batches, 15 steps. Rank 0 prints the final
parameters' bytes as a hash, for the test to compare runs whose fusion and timing differ.
Usage: deterministic_training.py"""

import hashlib

import torch

import ringreduce.torch as rr

rr.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
                            torch.nn.Linear(256, 10))
rr.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = rr.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                    named_parameters=model.named_parameters())
data = torch.Generator().manual_seed(100 + rr.rank())
for _ in range(15):
    inputs = torch.randn(32, 64, generator=data) * 10.0 ** torch.randint(-3, 4, (32, 1), generator=data)
    labels = torch.randint(0, 10, (32,), generator=data)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), labels).backward()
    optimizer.step()
if rr.rank() == 0:
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"parameters {digest}", flush=True)
rr.shutdown()
