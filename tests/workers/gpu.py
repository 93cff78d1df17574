"""Collectives on CuPy arrays; saves host copies of the results. Usage: gpu.py OUT_DIR"""

import os
import sys

import cupy
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import ringreduce as rr  # noqa: E402

import cases  # noqa: E402

rr.init()
rank = rr.rank()
out = {}
for dtype in ("float32", "int64"):
    x = cupy.asarray(cases.values(rank, dtype, 1001))
    result = rr.allreduce(x, op=rr.Sum)
    assert isinstance(result, cupy.ndarray)
    out[f"allreduce-{dtype}"] = result.get()
out["allreduce-fp16"] = rr.allreduce(cupy.asarray(cases.normal(rank, "float32", 1001)), op=rr.Sum,
                                     compression=rr.Compression.fp16).get()
in_place = cupy.asarray(cases.values(rank, "float64", 33))
rr.allreduce_(in_place, op=rr.Max)
out["allreduce_-max"] = in_place.get()
out["allgather"] = rr.allgather(cupy.asarray(cases.values(rank, "int32", 2 * (rank + 1)).reshape(rank + 1, 2))).get()
target = cupy.asarray(cases.values(rank, "float32", 10))
rr.broadcast_(target, root_rank=0)
out["broadcast_"] = target.get()
np.savez(os.path.join(sys.argv[1], f"rank{rank}.npz"), **out)
