"""A rank of a job Slurm placed: its host, place, binding, GPU and an allreduce, as JSON.
Usage: slurm_job.py [--gpu]   (--gpu: CuPy is loaded before init, so init chooses this rank's GPU)"""

import json
import os
import socket
import sys

import numpy as np

import ringreduce as rr

GPU = "--gpu" in sys.argv
if GPU:
    import cupy
rr.init()
summed = rr.allreduce(np.full(3, rr.rank() + 1.0), op=rr.Sum, name="slurm")
print(json.dumps({"host": socket.gethostname(), "rank": rr.rank(), "size": rr.size(), "sum": summed.tolist(),
                  "cpus": sorted(os.sched_getaffinity(0)), "local_rank": os.environ.get("LOCAL_RANK"),
                  "group_rank": os.environ.get("GROUP_RANK"), "threads": os.environ.get("OMP_NUM_THREADS"),
                  "gpu": cupy.cuda.Device().id if GPU else None}),
      flush=True)
