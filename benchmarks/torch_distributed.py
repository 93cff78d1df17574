"""torch.distributed on the ringreduce backend against gloo, in the same run: a bare all_reduce
from 4 KiB to 64 MiB (and ringreduce's own allreduce_ beside it), and DDP's training step on the
training benchmark's MLP and small CNN (its batch of 32 per rank, one thread per rank). Run under
rrun; rank 0 prints the table. `make bench` runs it with the cost model fitted to the machine
(`rrun --calibrate`), as the README advises: the built-in profile is another machine's.

    rrun -np 2 python benchmarks/torch_distributed.py
"""

import statistics
import time

import torch
import torch.distributed as dist
from training import MODELS

import ringreduce.torch as rr

SIZES = [4 << 10, 256 << 10, 4 << 20, 64 << 20]


ROUNDS = 7  # the variants take turns, ROUNDS times; each row gives the median of its rounds


def timed(run, repeats):
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - start) / repeats


def medians(runs, repeats):
    """Each run's median time per call over ROUNDS rounds in which the runs take turns, each round
    starting with the next one (what runs right after gloo, whose threads spin on, pays for it)."""
    for run in runs:
        run()
    times = [[] for _ in runs]
    for round_number in range(ROUNDS):
        for i in [(round_number + k) % len(runs) for k in range(len(runs))]:
            times[i].append(timed(runs[i], repeats))
    return [statistics.median(t) for t in times]


BATCH_PER_RANK = 32


def ddp_step(build, group):
    """One training step of DDP on the model `build` makes, over `group` (None: the default
    group, ringreduce's)."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build(), process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(BATCH_PER_RANK, 3, 32, 32), torch.randint(0, 10, (BATCH_PER_RANK,))

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return step


def all_reduce_row(nbytes, gloo):
    tensor = torch.ones(nbytes // 4)
    repeats = max(3, min(100, (16 << 20) // nbytes))
    times = medians([lambda: dist.all_reduce(tensor), lambda: dist.all_reduce(tensor, group=gloo),
                     lambda: rr.allreduce_(tensor, op=rr.Sum, name=f"bench.{nbytes}")], repeats)
    return f"all_reduce {nbytes >> 10} KiB", *times


def main():
    dist.init_process_group("ringreduce")
    gloo = dist.new_group(backend="gloo")
    rows = [all_reduce_row(nbytes, gloo) for nbytes in SIZES]
    torch.set_num_threads(1)  # as the training benchmark: one core per rank
    for name, build in MODELS.items():
        parameters = sum(p.numel() for p in build().parameters())
        rows.append((f"DDP step ({name}, {parameters / 1e6:.2f} M parameters)",
                     *medians([ddp_step(build, None), ddp_step(build, gloo)], 10), None))
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} ranks | ringreduce backend | gloo | gloo / ringreduce | rr.allreduce_")
        for name, mine, theirs, own in rows:
            print(f"{name} | {mine * 1e3:.3f} ms | {theirs * 1e3:.3f} ms | {theirs / mine:.2f}x | "
                  + (f"{own * 1e3:.3f} ms" if own is not None else "-"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
