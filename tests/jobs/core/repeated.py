"""Runs transports.PersistentAllreduce three times on changing buffers, and three small allreduces
through MPIAlgorithms (which uses persistent ones below `persistent_below`), both on a communicator
with persistent collectives and on one as an MPI before 4.0 presents it (no Allreduce_init), and
reports the results. Usage: repeated.py"""

import json
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from ringreduce.algorithms.mpi_native import MPIAlgorithms  # noqa: E402
from ringreduce.machine.transport import MPITransport, PersistentAllreduce  # noqa: E402
from ringreduce.ops import ReduceOp  # noqa: E402


class WithoutPersistentCollectives:
    """A communicator of an MPI library from before 4.0, as mpi4py presents one."""

    def __init__(self, comm):
        self.comm = comm

    def Allreduce_init(self, *args):  # noqa: N802 - mpi4py's name
        raise NotImplementedError("MPI_Allreduce_init")

    def __getattr__(self, name):  # everything else is the communicator's own
        return getattr(self.comm, name)


comm = MPI.COMM_WORLD.Dup()
rank = comm.rank
for label, on in (("persistent", comm), ("fallback", WithoutPersistentCollectives(comm))):
    send, received = np.empty(5, np.int64), np.empty(5, np.int64)
    repeated = PersistentAllreduce(on, send, received, MPI.MAX)
    results = []
    for round_ in range(3):
        send[:] = np.arange(5) * (rank + 1) + 10 * round_
        repeated()
        results.append(received.tolist())
    repeated.free()
    algorithms = MPIAlgorithms(MPITransport(on), persistent_below=1 << 10)
    sums = []
    for round_ in range(3):
        result = np.empty(7, np.float64)
        algorithms.allreduce(result, ReduceOp.SUM, np.arange(7.0) * (rank + 1) + round_)
        sums.append(result.tolist())
    still_repeating = algorithms.persistent_below > 0
    algorithms.close()
    print("REPORT " + json.dumps({"label": label, "persistent": repeated.persistent, "results": results,
                                  "sums": sums, "still_repeating": still_repeating}), flush=True)
comm.Free()
