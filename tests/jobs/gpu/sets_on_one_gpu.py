"""Every process set of 3 ranks (the global one and each pair) allreduces CuPy arrays through NCCL
at once, each rank starting its sets in its own order (even ranks first to last, odd ones last to
first), step after step. NCCL kernels of several communicators on one GPU may deadlock when ranks
start them in different orders (the emulated NCCL runs one kernel at a time, its worst case):
ringreduce must give each set's collectives the GPU in turn. Saves each step's host results.
Usage: sets_on_one_gpu.py OUT_DIR STEPS"""

import os
import sys

import cupy
import numpy as np

import ringreduce as rr

rr.init()
rank, size = rr.rank(), rr.size()
members = [list(range(size)), [0, 1], [1, 2], [0, 2]]
sets = [rr.global_process_set] + [rr.add_process_set(ranks) for ranks in members[1:]]
mine = [index for index, ranks in enumerate(members) if rank in ranks]
order = mine if rank % 2 == 0 else mine[::-1]
results = np.zeros((int(sys.argv[2]), len(sets)), np.float32)
for step in range(len(results)):
    handles = {index: rr.allreduce_async(cupy.full(4096, float(rank + 1 + step + 10 * index), dtype=cupy.float32),
                                         op=rr.Sum, name=f"set{index}", process_set=sets[index]) for index in order}
    for index, handle in handles.items():
        summed = rr.synchronize(handle).get()
        assert (summed == summed[0]).all()
        results[step, index] = summed[0]
np.save(os.path.join(sys.argv[1], f"rank{rank}.npy"), results)
rr.shutdown()
