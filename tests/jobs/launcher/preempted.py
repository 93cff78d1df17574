"""Trains until told to stop (SIGUSR1 from a scheduler, passed on by rrun; SIGTERM; or, given
WITHIN, the job's time limit that close), then commits a checkpoint, leaves the step it stopped
at in CHECKPOINT_DIR/stopped-rank<r> (its output line may not make it out: under Open MPI the
daemon that forwards it ends with Slurm's SIGTERM) and exits 0.
Usage: preempted.py CHECKPOINT_DIR [WITHIN]"""

import os
import sys
import time

import numpy as np

import ringreduce as rr
from ringreduce import checkpoint

rr.init()
within = float(sys.argv[2]) if len(sys.argv) > 2 else None
step = 0
while True:
    weights = rr.allreduce(np.full(4, float(step)), op=rr.Sum, name="step")
    if rr.stop_requested(within):
        checkpoint.save({"step": step, "weights": weights}, sys.argv[1], step)
        print(f"stopped at step {step}", flush=True)
        os.makedirs(sys.argv[1], exist_ok=True)  # rank 0 makes it, maybe not yet
        with open(os.path.join(sys.argv[1], f"stopped-rank{rr.rank()}"), "w") as stopped:
            stopped.write(str(step))
        break
    if step == 3:
        print("training", flush=True)
    step += 1
    time.sleep(0.02)
