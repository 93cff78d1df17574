"""Thousands of random collectives, each checked against numpy on every rank.
Usage: soak.py COUNT SEED; prints 'REPORT {"checked": n, "mismatches": [...]}'.

Every rank draws the same list of collectives (kind, dtype, op, shape, root) in rounds, submits
each round's requests asynchronously in an order of its own, waits for them all, and checks
every result against the reference computed from every rank's input (which each rank can
generate). Values are small whole numbers, so every reference is exact.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import ringreduce as rr  # noqa: E402

import cases  # noqa: E402

rr.init()
rank, size = rr.rank(), rr.size()
count, seed = int(sys.argv[1]), int(sys.argv[2])
plan_rng = np.random.default_rng(seed)
order_rng = np.random.default_rng([seed, rank])
KINDS = ("allreduce", "allreduce", "allgather", "broadcast", "reducescatter", "alltoall")


def draw(index):
    kind = str(plan_rng.choice(KINDS))
    dtype = str(plan_rng.choice(cases.DTYPES))
    op = str(plan_rng.choice(cases.BOOL_OPS if dtype == "bool" else cases.OPS))
    # Mostly small, sometimes large enough for the pieces of every algorithm.
    length = int(plan_rng.integers(0, 300_000)) if plan_rng.random() < 0.05 else int(plan_rng.integers(0, 2000))
    return {"name": f"soak.{index}", "kind": kind, "dtype": dtype, "op": op, "length": length,
            "root": int(plan_rng.integers(0, size)), "salt": index}


def inputs(spec, r):
    length = spec["length"]
    if spec["kind"] == "allgather":
        length = (length + r) % 997  # ragged first dimension
    if spec["kind"] == "alltoall":
        length -= length % size
    return cases.values(r, spec["dtype"], length, salt=spec["salt"])


def submit(spec):
    mine, op = inputs(spec, rank), getattr(rr, spec["op"])
    kind, name = spec["kind"], spec["name"]
    if kind == "allreduce":
        return rr.allreduce_async(mine, op=op, name=name)
    if kind == "allgather":
        return rr.allgather_async(mine, name=name)
    if kind == "broadcast":
        return rr.broadcast_async(mine, root_rank=spec["root"], name=name)
    if kind == "reducescatter":
        return rr.reducescatter_async(mine, op=op, name=name)
    return rr.alltoall_async(mine, name=name)


def expected(spec):
    every = [inputs(spec, r) for r in range(size)]
    kind = spec["kind"]
    if kind == "allreduce":
        return cases.reference_reduce(every, spec["op"])
    if kind == "allgather":
        return np.concatenate(every)
    if kind == "broadcast":
        return every[spec["root"]]
    if kind == "reducescatter":
        whole = cases.reference_reduce(every, spec["op"])
        rows = [len(whole) // size + (r < len(whole) % size) for r in range(size)]
        start = sum(rows[:rank])
        return whole[start:start + rows[rank]]
    share = len(every[0]) // size
    return np.concatenate([every[r][rank * share:(rank + 1) * share] for r in range(size)])


checked, mismatches, index = 0, [], 0
while index < count:
    specs = [draw(index + i) for i in range(min(int(plan_rng.integers(1, 40)), count - index))]
    index += len(specs)
    handles = {}
    for position in order_rng.permutation(len(specs)):
        handles[specs[position]["name"]] = submit(specs[position])
    for spec in specs:
        got, want = rr.synchronize(handles[spec["name"]]), expected(spec)
        if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
            mismatches.append(spec)
        checked += 1
print("REPORT " + json.dumps({"checked": checked, "mismatches": mismatches[:5], "mismatched": len(mismatches)}),
      flush=True)
