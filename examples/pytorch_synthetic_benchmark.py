"""Images per second of a small CNN on synthetic data, as Horovod's synthetic benchmark measures.

    rrun -np 1 python examples/pytorch_synthetic_benchmark.py
    rrun -np 2 python examples/pytorch_synthetic_benchmark.py

Each rank trains on its own random batch; the total is the sum over ranks. Compare the two
runs: with perfect scaling the total doubles with twice the ranks (on a machine with cores to
spare; on 2 cores, 2 ranks also share them with each other's computation). Where there are
GPUs, each rank trains on the one rr.init() gave it and the gradients are allreduced on the GPU
(--no-cuda: on the CPU).
"""

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import ringreduce.torch as rr

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--num-warmup-batches", type=int, default=3)
parser.add_argument("--num-batches-per-iter", type=int, default=5)
parser.add_argument("--num-iters", type=int, default=5)
parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16")
parser.add_argument("--no-cuda", action="store_true", help="train on the CPU even where there is a GPU")


def small_cnn():
    """The benchmark's model: three convolutions and a classifier, 94 K parameters."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(128, 10),
    )


def main():
    args = parser.parse_args()
    rr.init()  # on a GPU machine this makes the rank's own GPU torch's current device
    torch.manual_seed(rr.rank())
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // rr.local_size()))
    device = torch.device("cuda" if torch.cuda.is_available() and not args.no_cuda else "cpu")
    model = small_cnn().to(device)
    compression = rr.Compression.fp16 if args.fp16_allreduce else rr.Compression.none
    optimizer = rr.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * rr.size()),
                                        named_parameters=model.named_parameters(), compression=compression)
    rr.broadcast_parameters(model.state_dict(), root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    target = torch.randint(0, 10, (args.batch_size,), device=device)

    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()  # the step is timed to its end, not to its last launch

    for _ in range(args.num_warmup_batches):
        benchmark_step()
    rates = []
    for iteration in range(args.num_iters):
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            benchmark_step()
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start)
        rates.append(rate)
        if rr.rank() == 0:
            print(f"iteration {iteration}: {rate:.1f} img/sec per rank")
    total = rr.allreduce(torch.tensor([statistics.mean(rates)], dtype=torch.float64), op=rr.Sum, name="rates").item()
    print(f"img/sec per rank: {statistics.mean(rates):.1f} +- {statistics.pstdev(rates):.1f}")  # each rank's
    if rr.rank() == 0:
        print(f"total img/sec on {rr.size()} rank(s) ({device.type}): {total:.1f}")


if __name__ == "__main__":
    main()
