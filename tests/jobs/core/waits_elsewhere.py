"""Rank 0 waits in a collective of the whole job while rank 1 is blocked elsewhere, first in recv
from rank 2, then in a collective of process set [1, 2], each for 2.5 s (rank 2 is computing):
with RINGREDUCE_DEADLOCK_TIME=1 neither is a deadlock. Prints what each rank got.
Usage: waits_elsewhere.py"""

import time

import numpy as np

import ringreduce as rr

rr.init()
rank = rr.rank()
tail = rr.add_process_set([1, 2])
for step, how in enumerate(("recv", "set")):
    if rank == 1:
        if how == "recv":
            into = np.empty(3)
            rr.recv(into, 2)
        else:
            rr.allreduce(np.ones(3), name=f"tail.{step}", process_set=tail)
    elif rank == 2:
        time.sleep(2.5)
        if how == "recv":
            rr.send(np.ones(3), 1)
        else:
            rr.allreduce(np.ones(3), name=f"tail.{step}", process_set=tail)
    total = rr.allreduce(np.full(2, rank, np.float64), op=rr.Sum, name=f"everyone.{step}")
    print(f"{how}: sum {total.tolist()}", flush=True)
