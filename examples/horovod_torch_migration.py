"""A PyTorch training script written against Horovod's documented API, run by ringreduce: the
import line is the only change. It uses what Horovod scripts in the wild use: the deprecated
`average=`, fp16 compression, a compressor of its own, broadcast_optimizer_state, and join()
for ranks with uneven data.

    rrun -np 2 python examples/horovod_torch_migration.py
"""

import torch
import torch.nn.functional as F

import ringreduce.torch as hvd  # was: import horovod.torch as hvd


class ScaledFP16(hvd.compression.Compressor):
    """fp16 on the wire, scaled down first so that sums over ranks stay in float16's range."""

    @staticmethod
    def compress(tensor):
        return (tensor / 1024).to(torch.float16), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) * 1024


hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)

torch.manual_seed(1 + hvd.rank())  # every rank starts from a different model: the broadcasts fix that
for parameter in model.parameters():
    parameter.data.add_(torch.randn_like(parameter) * 0.01)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16)

generator = torch.Generator().manual_seed(42 + hvd.rank())
teacher = torch.Generator().manual_seed(7)
truth = torch.randn(20, 4, generator=teacher)
batches = 30 + 5 * hvd.rank()  # uneven data: the ranks with less join() early
losses = []
for _ in range(batches):
    inputs = torch.randn(32, 20, generator=generator)
    labels = (inputs @ truth).argmax(dim=1)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(inputs), labels)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
last = hvd.join()
hvd.broadcast_parameters(model.state_dict(), root_rank=last)  # the rank that joined last has every update

first_loss = hvd.allreduce(torch.tensor(sum(losses[:5]) / 5), average=True, name="first_loss")
last_loss = hvd.allreduce(torch.tensor(sum(losses[-5:]) / 5), average=True, name="last_loss")
checksum = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).sum()
sums = hvd.allreduce(checksum.reshape(1), compression=ScaledFP16, op=hvd.Sum, name="checksum")
same = bool(torch.allclose(sums / hvd.size(), checksum, rtol=1e-2))
if hvd.rank() == 0:
    print(f"loss {first_loss.item():.3f} -> {last_loss.item():.3f}; rank {last} joined last; "
          f"every rank holds the same model: {same}")
