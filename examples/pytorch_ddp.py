"""A plain torchrun-style DDP script: nothing in it is ringreduce's but the backend's name.

    rrun -np 2 python examples/pytorch_ddp.py --backend ringreduce
    rrun -np 2 python examples/pytorch_ddp.py --backend gloo
    torchrun --nproc-per-node=2 examples/pytorch_ddp.py --backend gloo

rrun gives every rank torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), so
init_process_group needs no argument but the backend; `import ringreduce.torch` makes
"ringreduce" one.
"""

import argparse

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import ringreduce.torch  # noqa: F401 - the "ringreduce" backend


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="ringreduce")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()

    digits = load_digits()
    data = TensorDataset(torch.tensor(digits.data / 16, dtype=torch.float32), torch.tensor(digits.target))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                                        torch.nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * size, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(y), len(y)])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: mean loss {total[0] / total[1]:.4f} over {int(total[1])} samples, {size} ranks, "
                  f"{args.backend}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
