"""Allreduces with prescale and postscale factors (and Average), for every dtype that scales, at a
small size (MPI's own collective) and a large one (ringreduce's); saves what each gave.
Usage: scaling.py OUT_DIR"""

import os
import sys

import numpy as np

import ringreduce as rr

rr.init()
rank, size = rr.rank(), rr.size()
PRESCALE, POSTSCALE = 0.1, 3.7
results = {}
for dtype in ("float16", "float32", "float64", "int32", "uint16"):
    for count in (7, 40000):
        values = np.random.default_rng([rank, count]).uniform(0, 1000, count).astype(dtype)
        key = f"{dtype}-{count}"
        results[f"{key}-sum"] = rr.allreduce(values, op=rr.Sum, prescale_factor=PRESCALE, postscale_factor=POSTSCALE)
        if dtype.startswith("float"):
            results[f"{key}-average"] = rr.allreduce(values, op=rr.Average, postscale_factor=POSTSCALE)
np.savez(os.path.join(sys.argv[1], f"rank{rank}.npz"), **results)
