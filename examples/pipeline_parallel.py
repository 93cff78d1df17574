"""Pipeline-parallel training on scikit-learn's handwritten digits: the model's layers split into
stages, one per rank, micro-batches passed along (GPipe's fill and drain).

    rrun -np 2 python examples/pipeline_parallel.py      # 2 stages, 4 micro-batches per batch
    rrun -np 3 python examples/pipeline_parallel.py --schedule 1f1b

Each rank builds only its own stage and steps its own optimizer; the gradients it holds after
GPipe.step() are those of the whole batch, so the job trains the model one process would train:
`--save` writes the whole model's weights (rank 0).
"""

import argparse
import os

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ringreduce.torch as rr

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--micro-batches", type=int, default=4)
parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--save", help="write the whole model's weights here (rank 0), after training")
args = parser.parse_args()

rr.init()
torch.set_num_threads(max(1, (os.cpu_count() or 1) // rr.local_size()))
torch.manual_seed(0)
layers = [torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(),
          torch.nn.Linear(64, 10)]  # built whole on every rank from one seed; each keeps its stage
bounds = [round(i * len(layers) / rr.size()) for i in range(rr.size() + 1)]  # this rank's layers
first = bounds[rr.rank()]
stage = torch.nn.Sequential(*layers[first:bounds[rr.rank() + 1]])
pipe = rr.GPipe(stage)
optimizer = torch.optim.SGD(stage.parameters(), lr=args.lr, momentum=0.9)

data = load_digits()
x, y = torch.tensor(data.data, dtype=torch.float32) / 16.0, torch.tensor(data.target)
train_x, test_x, train_y, test_y = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
is_first, is_last = rr.rank() == 0, rr.rank() == rr.size() - 1
for epoch in range(args.epochs):
    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(epoch))
    for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
        batch = order[start:start + args.batch_size]
        optimizer.zero_grad()
        loss = pipe.step(train_x[batch] if is_first else None, train_y[batch] if is_last else None,
                         F.cross_entropy, micro_batches=args.micro_batches, schedule=args.schedule)
        optimizer.step()
    if is_last:
        print(f"epoch {epoch + 1:2d}  loss {loss.item():.4f}", flush=True)

weights = {f"{first + int(name.split('.')[0])}.{name.split('.')[1]}": value
           for name, value in stage.state_dict().items()}
whole = rr.allgather_object(weights)
if rr.rank() == 0:
    state = {name: value for part in whole for name, value in part.items()}
    if args.save:
        torch.save(state, args.save)
    model = torch.nn.Sequential(*layers)
    model.load_state_dict(state)
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item() * 100
    print(f"{rr.size()} stages, {args.micro_batches} micro-batches, {args.schedule}: test accuracy {accuracy:.1f}%")
