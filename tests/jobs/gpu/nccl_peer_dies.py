"""Allreduces on (emulated) CuPy arrays through NCCL until a peer dies inside one: world rank 2 is
killed inside its NCCL collective of step 5 (EMULATED_NCCL_DIE=2:6), and the survivors' NCCL
kernels wait for it for ever. Each survivor prints, as JSON, the step at which ringreduce gave it
control back and the error it raised, and ends.
Usage: nccl_peer_dies.py STEPS"""

import json
import sys

import cupy

import ringreduce as rr
from ringreduce import runtime

rr.init()
step = 0
try:
    while step < int(sys.argv[1]):
        rr.allreduce(cupy.full(1000, rr.rank() + 1.0, dtype=cupy.float32), op=rr.Sum, name="grad")
        step += 1
except rr.RingReduceError as error:
    print(json.dumps({"rank": rr.rank(), "step": step, "error": str(error),
                      "transport": runtime.active().gpu_transport}), flush=True)
