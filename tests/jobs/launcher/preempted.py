"""Trains until told to stop (SIGUSR1 from a scheduler, passed on by rrun; SIGTERM; or, given
WITHIN, the job's time limit that close), then commits a checkpoint and exits 0.
Usage: preempted.py CHECKPOINT_DIR [WITHIN]"""

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
        break
    if step == 3:
        print("training", flush=True)
    step += 1
    time.sleep(0.02)
