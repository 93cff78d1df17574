"""Train a small convolutional network on scikit-learn's handwritten digits, data-parallel.

    rrun -np 2 python examples/pytorch_digits.py

The changes from a single-process script are marked "ringreduce": init, a sampler that gives
each rank its own shard, the wrapped optimizer, one broadcast so every rank starts from the
same weights, and averaging the metrics over ranks before rank 0 prints them.

`--communication` trains with one of the options for slow links instead of synchronous averaging
(docs/communication.md), e.g. `--communication powersgd`. `--load-balancing` splits each global batch
among the ranks by their measured speed (docs/load_balancing.md).
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ringreduce.torch as rr

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.02, help="for one rank; scaled by the number of ranks")
parser.add_argument("--checkpoint", default="checkpoints/pytorch_digits.pt")
parser.add_argument("--communication", default="synchronous",
                    choices=["synchronous", "bf16", "powersgd", "topk", "local-sgd", "stale"],
                    help="bf16 casts, PowerSGD rank 4, top-k 1 %% with error feedback, local SGD averaging "
                         "every 4 steps, or stale averaging (one step late)")
parser.add_argument("--load-balancing", action="store_true",
                    help="give faster ranks more of each global batch (not with --communication local-sgd)")
args = parser.parse_args()
if args.load_balancing and args.communication == "local-sgd":
    parser.error("--load-balancing weights the averaged gradients; local SGD averages the model instead")

rr.init()  # ringreduce
torch.manual_seed(1234)
torch.set_num_threads(max(1, (os.cpu_count() or 1) // rr.local_size()))  # share the cores of a node

# 1797 images of 8x8 pixels, shipped with scikit-learn: no download.
digits = load_digits()
images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
labels = torch.tensor(digits.target)
train_x, test_x, train_y, test_y = train_test_split(images, labels, test_size=0.2, random_state=0,
                                                    stratify=labels)
train_set, test_set = TensorDataset(train_x, train_y), TensorDataset(test_x, test_y)
# ringreduce: each rank reads its own shard of the data (with load balancing: its share of each batch).
balancer = rr.LoadBalancer(batch_size=args.batch_size * rr.size()) if args.load_balancing else None
if balancer is not None:
    train_sampler = rr.BalancedBatchSampler(train_set, balancer, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_sampler=train_sampler)
else:
    train_sampler = DistributedSampler(train_set, num_replicas=rr.size(), rank=rr.rank(), shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
test_sampler = DistributedSampler(test_set, num_replicas=rr.size(), rank=rr.rank(), shuffle=False)
test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

model = torch.nn.Sequential(
    torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10),
)
# The global batch grows with the number of ranks, so the learning rate does too.
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * rr.size(), momentum=0.9)


def distributed(optimizer):
    """ringreduce: the optimizer, averaging over the ranks as --communication says."""
    if args.communication == "local-sgd":  # each rank steps on its own; the model is averaged every 4 steps
        return rr.PostLocalSGDOptimizer(optimizer, rr.PeriodicModelAverager(period=4))
    compression = {"bf16": rr.Compression.bf16,
                   "powersgd": rr.PowerSGD(matrix_approximation_rank=4, start_powerSGD_iter=30),
                   "topk": rr.Compression.error_feedback(rr.Compression.topk(0.01))}
    return rr.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                   compression=compression.get(args.communication, rr.Compression.none),
                                   staleness=1 if args.communication == "stale" else 0, load_balancer=balancer)


optimizer = distributed(optimizer)
rr.broadcast_parameters(model.state_dict(), root_rank=0)  # ringreduce
rr.broadcast_optimizer_state(optimizer, root_rank=0)  # ringreduce


def evaluate():
    """Accuracy over the whole test set: each rank counts its shard, the counts are summed."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in test_loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    model.train()
    counts = rr.allreduce(torch.tensor([correct, total], dtype=torch.float64), op=rr.Sum, name="test_counts")
    return 100.0 * counts[0].item() / counts[1].item()


start = time.perf_counter()
for epoch in range(args.epochs):
    train_sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
    loss_sum = torch.zeros(1, dtype=torch.float64)
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item()
    loss = rr.allreduce(loss_sum / len(train_loader), name="train_loss").item()  # ringreduce: mean over ranks
    accuracy = evaluate()
    if rr.rank() == 0:
        print(f"epoch {epoch + 1:2d}  train loss {loss:.4f}  test accuracy {accuracy:.1f}%  "
              f"({time.perf_counter() - start:.1f} s)", flush=True)

if args.communication == "stale":
    optimizer.synchronize()  # the last step's average is still in flight: wait for it
elif args.communication == "local-sgd":  # the replicas differ between averages: end with one model
    rr.grouped_allreduce_([p.data for p in model.parameters()], name="final_model")
if rr.rank() == 0:  # one copy of the checkpoint is enough: every rank has the same model
    os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epochs": args.epochs},
               args.checkpoint)
    print(f"saved {args.checkpoint}")
