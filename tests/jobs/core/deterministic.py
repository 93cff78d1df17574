"""Float32 sums whose bits depend on the order in which the ranks' values are added, made three
ways: a tensor alone, the same tensor fused behind one of odd length, and inside a bigger group;
and an average and a reducescatter of it. Run under the family, piece size and switch the test
sets; each rank saves its results to OUT/rank<r>.npz.
Usage: deterministic.py OUT"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import ringreduce as rr  # noqa: E402

import cases  # noqa: E402

LENGTH = 40_001  # past what plain calls carry with them (engine/plain_calls.py): the families run it

rr.init()
rank = rr.rank()
x = cases.mixed_magnitudes(rank, LENGTH)
results = {
    "alone": rr.allreduce(x, op=rr.Sum, name="alone"),
    "behind_odd": rr.grouped_allreduce([cases.mixed_magnitudes(rank, 7, 1), x], op=rr.Sum, name="behind_odd")[1],
    "in_group": rr.grouped_allreduce([cases.mixed_magnitudes(rank, 3, 2), cases.mixed_magnitudes(rank, 5000, 3), x],
                                     op=rr.Sum, name="in_group")[2],
    "average": rr.allreduce(x, op=rr.Average, name="average"),
    "reducescatter": rr.reducescatter(x.reshape(-1, 1), op=rr.Sum, name="reducescatter").reshape(-1),
}
np.savez(os.path.join(sys.argv[1], f"rank{rank}.npz"), **results)
rr.shutdown()
