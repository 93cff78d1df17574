"""Collectives for rrun's flight recorder and monitor to show.

hang S: 40 small allreduces, then rank 1 sleeps S seconds before 'loss' (rank 0 waits in it).
slow S: 3 ranks allreduce for S seconds, rank 1 sleeping 20 ms before each; then rank 0 prints
the straggler report as JSON and rank 2 raises."""

import json
import sys
import time

import numpy as np

import ringreduce as rr

mode, seconds = sys.argv[1], float(sys.argv[2])
rr.init()
if mode == "hang":
    for step in range(40):
        rr.allreduce(np.full(10, step, np.float32), name=f"grad.{step}")
    if rr.rank() == 1:
        time.sleep(seconds)
    total = rr.allreduce(np.ones(3, np.float32), op=rr.Sum, name="loss")
    assert total.tolist() == [2.0, 2.0, 2.0]
else:
    end = time.monotonic() + seconds
    while rr.allreduce(np.array([time.monotonic() < end], np.int32), op=rr.Min, name="going")[0]:
        if rr.rank() == 1:
            time.sleep(0.02)
        rr.allreduce(np.ones(1000, np.float32), name="grad")
    report = rr.straggler_report()
    if rr.rank() == 0:
        print("report " + json.dumps(report["recent"]), flush=True)
    rr.barrier()
    if rr.rank() == 2:
        raise ValueError("rank 2 gives up after its steps")
rr.shutdown()
