"""Allreduces at three sizes under whatever the cost model chose, saved for the test to compare
with numpy, with the choice itself (REPORT line). Usage: cost_choice.py OUT_DIR"""

import json
import os
import sys

import numpy as np

import ringreduce as rr
from ringreduce import runtime

rr.init()
rank = rr.rank()
results = {f"n{n}": rr.allreduce(np.arange(n, dtype=np.float64) * (rank + 1), op=rr.Sum, name=f"n{n}")
           for n in (10, 100_000, 3_000_000)}
np.savez(os.path.join(sys.argv[1], f"rank{rank}.npz"), **results)
if rank == 0:
    print("REPORT " + json.dumps(runtime._active.engine.algorithms.tables["allreduce"]), flush=True)
rr.shutdown()
