"""Trains until told to stop (SIGUSR1 from a scheduler, passed on by rrun), then commits a
checkpoint and exits 0. Usage: preempted.py CHECKPOINT_DIR"""

import sys
import time

import numpy as np

import ringreduce as rr
from ringreduce import checkpoint

rr.init()
step = 0
while True:
    weights = rr.allreduce(np.full(4, float(step)), op=rr.Sum, name="step")
    if rr.stop_requested():
        checkpoint.save({"step": step, "weights": weights}, sys.argv[1], step)
        print(f"stopped at step {step}", flush=True)
        break
    if step == 3:
        print("training", flush=True)
    step += 1
    time.sleep(0.02)
