"""cupy.cuda.nccl, emulated on host memory with MPI: the calls ringreduce makes, with NCCL's
arguments (pointers, element counts, datatype and op codes, a stream). Every reduction gathers
the ranks' data and combines it in rank order with numpy, so any dtype works, float16 and
bfloat16 (ml_dtypes') too.

A GPU runs one NCCL kernel at a time here: a kernel waits for its peers' while it holds the GPU,
and another communicator's kernel waits for it to end. That is the worst case NCCL allows (two
communicators' kernels need not both fit on a GPU), so collectives of two communicators started
in different orders on two ranks deadlock here, as NCCL warns they may.

A peer that dies mid-collective hangs the call's stream, as a real NCCL kernel then waits
forever: the call returns, and the stream's work is never done (no error from MPI, none from
check_async_error) until the communicator is aborted. The peers are watched by their pids, so
this works on one host. EMULATED_NCCL_DIE=R:N kills world rank R inside its Nth collective."""

import collections
import ctypes
import os
import shutil
import signal
import tempfile
import threading
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

from cupy import cuda

(NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16, NCCL_FLOAT32,
 NCCL_FLOAT64, NCCL_BFLOAT16) = range(10)
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = range(4)
_DTYPES = dict(zip(range(10), ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                               "float64", ml_dtypes.bfloat16), strict=True))
datatypes = set()  # every datatype code a collective was called with, for the tests to read
_UFUNCS = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum}


def get_version():
    return 22000


def get_unique_id():
    return os.urandom(16)


def _array(pointer, count, datatype):
    """The `count` elements of `datatype` at device pointer `pointer`, which must be live device
    memory of the current device (NCCL's communicator is bound to its device)."""
    dtype = np.dtype(_DTYPES[datatype])
    datatypes.add(datatype)
    device = cuda.check_device_pointer(pointer, count * dtype.itemsize, "an NCCL buffer")
    if device != cuda.current():
        raise NcclError(f"NCCL error: invalid argument (a buffer on GPU {device}, GPU {cuda.current()} current)")
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(pointer), dtype)


class NcclError(RuntimeError):
    pass


class NcclCommunicator:
    def __init__(self, ndev, comm_id, rank):
        self.comm = _members(ndev, comm_id, rank)
        assert (self.comm.size, self.comm.rank) == (ndev, rank)
        assert self.comm.allgather(comm_id) == [comm_id] * ndev, "the ranks were given different unique ids"
        self._peers = [pid for pid in self.comm.allgather(os.getpid()) if pid != os.getpid()]
        self._device = cuda.current()  # NCCL binds a communicator to the device current at its making
        self._hung = []  # the streams this communicator hung
        self._aborted = False

    def _queue(self, send, stream, finish):
        """Queue on `stream` a collective of `send` (pointer, count, datatype) that hands every
        rank's data to `finish`. It runs when the stream's work reaches it; where a peer has died
        first it hangs the stream instead."""
        if self._aborted:
            raise NcclError("NCCL error: invalid usage (the communicator was aborted)")
        if cuda.current() != self._device:
            raise NcclError(f"NCCL error: invalid usage (the communicator's GPU {self._device} is not current: "
                            f"GPU {cuda.current()} is)")
        queue = cuda.stream_at(stream)
        mine = _array(*send)  # checked now, read when run

        def collective():
            _calls.append(len(_calls))
            if os.environ.get("EMULATED_NCCL_DIE") == f"{MPI.COMM_WORLD.rank}:{len(_calls)}":
                os.kill(os.getpid(), signal.SIGKILL)
            gpu = _kernels[self._device]
            gpu.acquire()  # the GPU runs one NCCL kernel at a time: this one waits for the last to end
            everyone = np.empty((self.comm.size, len(mine)), mine.dtype)
            request = self.comm.Iallgather(mine.copy().view(np.uint8), everyone.view(np.uint8))
            while not _test(request):
                if not all(_alive(pid) for pid in self._peers):
                    self._hung.append(queue)  # the kernel stays on the GPU until the abort
                    return False
                time.sleep(0.0005)
            gpu.release()
            finish(everyone)
        queue.enqueue(collective)

    def check_async_error(self):
        pass  # a dead peer makes NCCL wait, not fail

    def abort(self):
        """End what this communicator's calls left hanging; the communicator is no longer usable."""
        self._aborted = True
        if self._hung and hasattr(self.comm, "Revoke"):
            self.comm.Revoke()  # MPI's fault tolerance (ULFM): the errored gather is not waited for at exit
        for stream in self._hung:
            stream.abandon()
            _kernels[self._device].release()
        self._hung.clear()

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        received = _array(recvbuf, count, datatype)
        self._queue((sendbuf, count, datatype), stream,
                    lambda everyone: received.__setitem__(..., _UFUNCS[op].reduce(everyone, axis=0)))

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        received = _array(recvbuf, recvcount, datatype)
        mine = slice(self.comm.rank * recvcount, (self.comm.rank + 1) * recvcount)
        self._queue((sendbuf, recvcount * self.comm.size, datatype), stream,
                    lambda everyone: received.__setitem__(..., _UFUNCS[op].reduce(everyone[:, mine], axis=0)))

    def allGather(self, sendbuf, recvbuf, sendcount, datatype, stream):  # noqa: N802
        received = _array(recvbuf, sendcount * self.comm.size, datatype)
        self._queue((sendbuf, sendcount, datatype), stream,
                    lambda everyone: received.__setitem__(..., everyone.reshape(-1)))

    def broadcast(self, sendbuf, recvbuf, count, datatype, root, stream):
        received = _array(recvbuf, count, datatype)
        self._queue((sendbuf, count, datatype), stream, lambda everyone: received.__setitem__(..., everyone[root]))


_calls = []  # one entry per collective this process made, for EMULATED_NCCL_DIE
_kernels = collections.defaultdict(threading.Lock)  # GPU -> held while an NCCL kernel runs there


def _members(ndev, comm_id, rank):
    """An MPI communicator of the ranks given `comm_id`, in their NCCL rank order. They meet in a
    folder named by the id (the emulation's bootstrap, as NCCL's is a socket: one host only), so
    a communicator of the survivors of a failed rank can be made without the dead one."""
    meeting = os.path.join(tempfile.gettempdir(), f"emulated-nccl-{bytes(comm_id).hex()}")
    os.makedirs(meeting, exist_ok=True)
    with open(os.path.join(meeting, str(rank)), "w") as mine:
        mine.write(str(MPI.COMM_WORLD.rank))
    while len(os.listdir(meeting)) < ndev:
        time.sleep(0.001)
    world_ranks = []
    for member in range(ndev):
        while True:
            with open(os.path.join(meeting, str(member))) as theirs:
                text = theirs.read()
            if text:
                break
            time.sleep(0.001)
        world_ranks.append(int(text))
    if world_ranks == list(range(MPI.COMM_WORLD.size)):
        comm = MPI.COMM_WORLD.Dup()
    else:  # from the group alone (MPI 4): only the members take part, not the world with its dead
        comm = MPI.Intracomm.Create_from_group(MPI.COMM_WORLD.Get_group().Incl(world_ranks), meeting)
    comm.Barrier()  # every member has read the folder
    if rank == 0:
        shutil.rmtree(meeting, ignore_errors=True)
    return comm


def _test(request):
    """Is `request` done? Not while a peer it waits for is dead (MPI's fault tolerance says so
    with an error: NCCL would wait)."""
    try:
        return request.Test()
    except MPI.Exception:
        return False


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
