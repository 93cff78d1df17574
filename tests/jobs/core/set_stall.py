"""Rank 1 submits an allreduce on process set [1, 2] that rank 2 submits 2.5 s later: with a
stall check every second, the report must name the set and the global ranks. Usage: set_stall.py"""

import time

import numpy as np

import ringreduce as rr

rr.init()
tail = rr.add_process_set([1, 2])
if rr.rank() == 1:
    rr.synchronize(rr.allreduce_async(np.ones(3), name="late.grad", process_set=tail))
elif rr.rank() == 2:
    time.sleep(2.5)
    rr.synchronize(rr.allreduce_async(np.ones(3), name="late.grad", process_set=tail))
rr.barrier()
