"""Runs transports.RepeatedAllreduce three times on changing buffers, as a persistent collective
and as an MPI before 4.0 would (no Allreduce_init), and reports the results.
Usage: repeated.py"""

import json
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ringreduce.transports import RepeatedAllreduce  # noqa: E402


class WithoutPersistentCollectives:
    """A communicator of an MPI library from before 4.0, as mpi4py presents one."""

    def __init__(self, comm):
        self.comm = comm

    def Allreduce_init(self, *args):  # noqa: N802 - mpi4py's name
        raise NotImplementedError("MPI_Allreduce_init")

    def Iallreduce(self, *args):  # noqa: N802
        return self.comm.Iallreduce(*args)


comm = MPI.COMM_WORLD.Dup()
rank = comm.rank
for label, on in (("persistent", comm), ("fallback", WithoutPersistentCollectives(comm))):
    send, received = np.empty(5, np.int64), np.empty(5, np.int64)
    repeated = RepeatedAllreduce(on, send, received, MPI.MAX)
    results = []
    for round_ in range(3):
        send[:] = np.arange(5) * (rank + 1) + 10 * round_
        repeated()
        results.append(received.tolist())
    repeated.free()
    print("REPORT " + json.dumps({"label": label, "persistent": repeated.persistent, "results": results}), flush=True)
comm.Free()
