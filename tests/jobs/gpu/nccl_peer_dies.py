"""An elastic job of allreduces on (emulated) CuPy arrays through NCCL, a commit after each step.
Run with EMULATED_NCCL_DIE=2:6, world rank 2 is killed inside its NCCL allreduce of step 5: the
survivors' NCCL kernels then wait for it for ever, and only the abort path lets them go on in
place at 2 ranks from the commit of step 4, through a new NCCL communicator. Each rank that ends
prints its steps' sums, its size and the GPU transport, as JSON.
Usage: nccl_peer_dies.py STEPS"""

import json
import sys

import cupy

import ringreduce as rr
from ringreduce import elastic, runtime

rr.init()


@elastic.run
def train(state):
    while state.step < int(sys.argv[1]):
        summed = rr.allreduce(cupy.full(1000, rr.rank() + 1.0, dtype=cupy.float32), op=rr.Sum, name="grad")
        state.sums.append(float(summed.get()[0]))
        state.step += 1
        state.commit()


state = elastic.ObjectState(step=0, sums=[])
train(state)
print(json.dumps({"rank": rr.rank(), "size": rr.size(), "sums": state.sums,
                  "transport": runtime.active().gpu_transport}), flush=True)
