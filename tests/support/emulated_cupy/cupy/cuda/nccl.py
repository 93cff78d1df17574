"""cupy.cuda.nccl, emulated on host memory with MPI: the calls ringreduce makes, with NCCL's
arguments (pointers, element counts, datatype and op codes, a stream). Every reduction gathers
the ranks' data and combines it in rank order with numpy, so any dtype works, float16 too."""

import ctypes
import os

import numpy as np
from mpi4py import MPI

(NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16, NCCL_FLOAT32,
 NCCL_FLOAT64) = range(9)
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = range(4)
_DTYPES = dict(zip(range(9), ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                              "float64"), strict=True))
_UFUNCS = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum}


def get_version():
    return 22000


def get_unique_id():
    return os.urandom(16)


def _array(pointer, count, datatype):
    dtype = np.dtype(_DTYPES[datatype])
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(pointer), dtype)


class NcclCommunicator:
    def __init__(self, ndev, comm_id, rank):
        self.comm = MPI.COMM_WORLD.Dup()
        assert (self.comm.size, self.comm.rank) == (ndev, rank), "the emulation runs on MPI.COMM_WORLD"
        assert self.comm.allgather(comm_id) == [comm_id] * ndev, "the ranks were given different unique ids"

    def _gathered(self, send):
        everyone = np.empty((self.comm.size, len(send)), send.dtype)
        self.comm.Allgather(send.copy().view(np.uint8), everyone.view(np.uint8))
        return everyone

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        everyone = self._gathered(_array(sendbuf, count, datatype))
        _array(recvbuf, count, datatype)[...] = _UFUNCS[op].reduce(everyone, axis=0)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        everyone = self._gathered(_array(sendbuf, recvcount * self.comm.size, datatype))
        mine = slice(self.comm.rank * recvcount, (self.comm.rank + 1) * recvcount)
        _array(recvbuf, recvcount, datatype)[...] = _UFUNCS[op].reduce(everyone[:, mine], axis=0)

    def allGather(self, sendbuf, recvbuf, sendcount, datatype, stream):  # noqa: N802
        everyone = self._gathered(_array(sendbuf, sendcount, datatype))
        _array(recvbuf, sendcount * self.comm.size, datatype)[...] = everyone.reshape(-1)

    def broadcast(self, sendbuf, recvbuf, count, datatype, root, stream):
        data = _array(sendbuf, count, datatype).copy()
        self.comm.Bcast(data.view(np.uint8), root)
        _array(recvbuf, count, datatype)[...] = data
