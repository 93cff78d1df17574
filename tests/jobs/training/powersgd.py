"""PowerSGD's averaging on numpy arrays at 2 ranks; saves what each call gave to OUT/rankR.npz and
the bytes each call put on the wire to OUT/rankR.json. Usage: powersgd.py OUT

exact: a rank-2 matrix on each rank with the same column space (so their mean has rank 2) and a
  vector, rank 2, no plain steps: the mean, to float tolerance, and the vector's exact mean.
warm: a full-rank matrix, 2 plain steps then 2 low-rank ones, with error feedback.
"""

import json
import os
import sys

import numpy as np

import ringreduce as rr
from ringreduce.training.powersgd import PowerSGD

out = sys.argv[1]
rr.init()
rank = rr.rank()
rng = np.random.default_rng(7)
shared = rng.standard_normal((32, 2)).astype(np.float32)
mine = np.random.default_rng(100 + rank)
saved, wire = {}, {}


def averaged(powersgd, key, named):
    before = rr.engine_stats()["bytes"]
    powersgd.average(named)
    wire[key] = rr.engine_stats()["bytes"] - before
    for name, array in named.items():
        saved[f"{key}-{name}"] = array.copy()


exact = PowerSGD(matrix_approximation_rank=2, start_powerSGD_iter=0)
averaged(exact, "exact", {"w": shared @ mine.standard_normal((2, 24)).astype(np.float32),
                          "b": np.arange(10, dtype=np.float32) * (rank + 1)})

warm = PowerSGD(matrix_approximation_rank=1, start_powerSGD_iter=2)
for step in range(4):
    gradient = np.random.default_rng([rank, step]).standard_normal((16, 8, 2)).astype(np.float32)
    saved[f"warm-input-{step}"] = gradient.copy()
    error_before = warm.errors.get("w", np.zeros((16, 16), np.float32)).copy()
    averaged(warm, f"warm-{step}", {"w": gradient})
    if step >= 2:  # what went out plus what is kept is what came in, with the last residual
        saved[f"warm-error-{step}"] = warm.errors["w"].copy()  # a buffer the next step reuses
        saved[f"warm-error-before-{step}"] = error_before

np.savez(os.path.join(out, f"rank{rank}.npz"), **saved)
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"wire": wire, "qs": {name: list(q.shape) for name, q in warm.qs.items()}}, f)
