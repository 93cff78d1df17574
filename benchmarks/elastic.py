"""What an elastic job's commit costs: TorchState.commit() of a model with SGD momentum (its state
doubles the bytes) at several sizes, against a plain copy of the same parameters in memory (the
least any snapshot costs), on every rank of the job; and the memory a commit holds.

    rrun -np 2 python benchmarks/elastic.py

A commit pickles the state once (kept in memory for restore()), writes it to the host's commit
directory (/dev/shm here: memory too) through a file that is fsynced and renamed, and exchanges one
small message among the ranks to confirm it. Each size is committed `--repeats` times; the median is
reported. Writes benchmarks/results/elastic.json.
"""

import argparse
import json
import os
import statistics
import time

import torch

import ringreduce.torch as rr

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SIZES_MB = (4, 64, 256)  # parameters, float32


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    # Outside an elastic job commits stay in memory; here they go to /dev/shm as an elastic job's do.
    os.environ.setdefault("RINGREDUCE_ELASTIC_JOB", "benchmark")
    rr.init()
    rows = []
    for megabytes in SIZES_MB:
        model = torch.nn.Linear(megabytes * 2**18 // 1024, 1024, bias=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(1, model.in_features)).sum().backward()
        optimizer.step()  # the momentum buffer exists: the state is twice the parameters
        state = rr.elastic.TorchState(model, optimizer, epoch=0)
        commit, copy = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            state.commit()
            commit.append(time.perf_counter() - started)
            started = time.perf_counter()
            snapshot = [p.detach().clone() for p in model.parameters()]
            copy.append(time.perf_counter() - started)
            del snapshot
        held = len(state._saved) / 2**20
        rows.append({"parameters_mb": megabytes, "state_mb": round(held, 1), "ranks": rr.size(),
                     "commit_ms": statistics.median(commit) * 1e3, "copy_ms": statistics.median(copy) * 1e3})
        state._store.discard()
    if rr.rank() == 0:
        print(f"{'parameters':>11} {'state':>8} {'commit':>10} {'plain copy':>11}   (medians of {args.repeats}, "
              f"{rr.size()} ranks)")
        for row in rows:
            print(f"{row['parameters_mb']:>8} MB {row['state_mb']:>5.0f} MB {row['commit_ms']:>7.1f} ms "
                  f"{row['copy_ms']:>8.1f} ms")
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, "elastic.json"), "w") as f:
            json.dump(rows, f, indent=1)


main()
