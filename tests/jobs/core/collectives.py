"""Runs every collective on the inputs of tests/support/cases.py and saves what this rank got,
for the test to compare with numpy. Usage: collectives.py OUT_DIR [ALGORITHM ...]

With algorithms named, it runs everything once per algorithm (RINGREDUCE_ALGORITHM), starting
ringreduce again for each, and saves each run's results in OUT_DIR/ALGORITHM/."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import ringreduce as rr  # noqa: E402

import cases  # noqa: E402


def run(folder):
    rr.init()
    rank, size = rr.rank(), rr.size()
    out = {}

    # Submitted together where asked (many ranks on few cores: one negotiation for all of them);
    # each still runs as a collective of its own when fusion is off.
    together = os.environ.get("COLLECTIVES_TOGETHER") == "1"
    pending = {}
    for key, dtype, op, length in cases.allreduce_cases(size):
        array = cases.case_input(rank, dtype, op, length)
        if together:
            pending[key] = rr.allreduce_async(array, op=getattr(rr, op), name=key)
        else:
            out[key] = rr.allreduce(array, op=getattr(rr, op), name=key)
    out.update({key: rr.synchronize(handle) for key, handle in pending.items()})

    for dtype in ("float32", "float64"):
        out[f"allreduce-random-{dtype}"] = rr.allreduce(cases.normal(rank, dtype, 999), op=rr.Sum)
    out["allreduce-10M"] = rr.allreduce(cases.values(rank, "float32", 10_000_000), op=rr.Sum)
    out["allreduce-shape"] = rr.allreduce(cases.values(rank, "float64", 60).reshape(3, 4, 5), op=rr.Sum)
    out["allreduce-scalar"] = rr.allreduce(np.float64(rank + 1), op=rr.Sum)
    for dtype in ("float64", "int32"):
        out[f"allreduce-scaled-{dtype}"] = rr.allreduce(
            cases.values(rank, dtype, 101), op=rr.Sum, prescale_factor=0.5, postscale_factor=3.0)
    strided = cases.values(rank, "float32", 40)[::2]
    out["allreduce-noncontiguous"] = rr.allreduce(strided, op=rr.Sum)
    readonly = cases.values(rank, "int16", 33)
    readonly.setflags(write=False)
    out["allreduce-readonly"] = rr.allreduce(readonly, op=rr.Max)
    in_place = cases.values(rank, "int64", 77)
    returned = rr.allreduce_(in_place, op=rr.Sum)
    assert returned is in_place
    out["allreduce_-inplace"] = in_place

    fused = [cases.fused_input(rank, i) for i in range(len(cases.FUSED_LENGTHS))]
    handles = [rr.allreduce_async(array, name=f"fused.{i}") if i == 2 else rr.allreduce_async_(array, name=f"fused.{i}")
               for i, array in enumerate(fused)]
    for i, (array, handle) in enumerate(zip(fused, handles, strict=True)):
        out[f"fused-{i}"] = rr.synchronize(handle)
        assert i == 2 or out[f"fused-{i}"] is array

    for dtype in cases.DTYPES:
        mine = cases.values(rank, dtype, 3 * (rank + 1)).reshape(rank + 1, 3)
        out[f"allgather-{dtype}"] = rr.allgather(mine)
    out["allgather-empty-on-rank0"] = rr.allgather(cases.values(rank, "int32", 2 * rank).reshape(rank, 2))

    out["alltoall-even"] = rr.alltoall(cases.values(rank, "int32", 6 * size).reshape(2 * size, 3))
    splits = [(rank + j) % 3 for j in range(size)]
    rows = sum(splits)
    result, received = rr.alltoall(cases.values(rank, "float32", 2 * rows).reshape(rows, 2), splits=splits)
    out["alltoall-uneven"], out["alltoall-uneven-received"] = result, received

    for root in range(size):
        out[f"broadcast-root{root}"] = rr.broadcast(cases.values(rank, "float64", 1001), root_rank=root)
        strided = cases.values(rank, "float32", 2 * 50_003)[::2]  # the root sends it from where it lies
        result = rr.broadcast(strided, root_rank=root)
        assert result is not strided and result.flags.c_contiguous
        out[f"broadcast-strided-root{root}"] = result
        target = cases.values(rank, "int8", 50).reshape(5, 10)
        rr.broadcast_(target, root_rank=root)
        out[f"broadcast_-root{root}"] = target

    for op in ("Sum", "Average"):
        mine = cases.values(rank, "float64", 2 * (2 * size + 1)).reshape(2 * size + 1, 2)
        out[f"reducescatter-{op}"] = rr.reducescatter(mine, op=getattr(rr, op))

    rr.barrier()
    objects = {
        "broadcast_object": [rr.broadcast_object({"from": rank, "items": list(range(rank + 3))}, root_rank=r)
                             for r in range(size)],
        "allgather_object": rr.allgather_object({"rank": rank, "text": "x" * rank}),
        "topology": [rr.rank(), rr.size(), rr.local_rank(), rr.local_size(), rr.cross_rank(), rr.cross_size()],
    }
    np.savez(os.path.join(folder, f"rank{rank}.npz"), **out)
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(objects, f)
    print("saved", len(out), "results")
    rr.shutdown()


if len(sys.argv) == 2:
    run(sys.argv[1])
for algorithm in sys.argv[2:]:
    os.environ["RINGREDUCE_ALGORITHM"] = algorithm
    os.makedirs(os.path.join(sys.argv[1], algorithm), exist_ok=True)
    run(os.path.join(sys.argv[1], algorithm))
