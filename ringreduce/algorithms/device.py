"""Collectives on flat device (CuPy) buffers, with the host families' interface: NCCL,
CUDA-aware MPI, or staging through pinned host memory into the host algorithms.

Each family queues its work on its own CUDA stream (`stream`); the device executor queues its
packing and casting kernels on the same stream, so they run in order without host waits, and
waits for the stream once (`synchronize()`), before it hands out results.
"""

import time

import numpy as np

from ringreduce.algorithms.mpi_native import MPIAlgorithms
from ringreduce.machine import faults
from ringreduce.machine.memory import Workspace
from ringreduce.numerics import reduction
from ringreduce.ops import ReduceOp

# A wait for NCCL's work queries its event without pausing for this long (a small collective's
# whole time: a sleep costs at least 50 us here), then looks for a failed rank and pauses this
# long between queries.
_SPIN_SECONDS = 0.0002
_POLL_SECONDS = 0.001


class Nccl:
    """NCCL through cupy.cuda.nccl, its communicator made at the first device collective (when
    every rank runs the same one) from a unique id that rank 0 broadcasts over MPI. Dtypes NCCL
    lacks (int16) go through `fallback`, and so do float sums and products where they must add
    in rank order (`rank_ordered`: NCCL's order depends on where an element lies)."""

    def __init__(self, cupy, nccl, comm, fallback, rank_ordered=False):
        self.cupy, self.nccl, self.comm, self.fallback = cupy, nccl, comm, fallback
        self.rank_ordered = rank_ordered
        self.stream = fallback.stream
        self._communicator = None
        # By dtype name: ml_dtypes' bfloat16 is a dtype only once something has imported it.
        names = ["int8", "uint8", "int32", "int64", "float16", "float32", "float64"]
        if hasattr(nccl, "NCCL_BFLOAT16") and nccl.get_version() >= 21000:  # NCCL 2.10 added it
            names.append("bfloat16")
        self._types = {name: getattr(nccl, "NCCL_" + name.upper()) for name in names}
        self._types["bool"] = nccl.NCCL_UINT8  # 0/1 bytes: Min, Max and Product agree
        self._ops = {ReduceOp.SUM: nccl.NCCL_SUM, ReduceOp.AVERAGE: nccl.NCCL_SUM, ReduceOp.MIN: nccl.NCCL_MIN,
                     ReduceOp.MAX: nccl.NCCL_MAX, ReduceOp.PRODUCT: nccl.NCCL_PROD}

    def _nccl(self):
        if self._communicator is None:
            unique_id = self.comm.bcast(self.nccl.get_unique_id() if self.comm.rank == 0 else None, root=0)
            self._communicator = self.nccl.NcclCommunicator(self.comm.size, unique_id, self.comm.rank)
        return self._communicator

    def synchronize(self):
        """Wait for the stream's work, watching for what would keep it from ever ending: a peer
        that died waits NCCL's kernels forever, and nothing else would get control. On a failed
        rank (rrun's word, machine/faults) or NCCL's own asynchronous error, the communicator is
        aborted (its kernels end, its stream is free again) and the error raised."""
        done = self.stream.record()
        spin_until = time.perf_counter() + _SPIN_SECONDS
        while not done.done:
            if time.perf_counter() < spin_until:
                continue
            try:
                faults.check()
                if self._communicator is not None:
                    self._communicator.check_async_error()
            except BaseException:
                self._abort()
                raise
            time.sleep(_POLL_SECONDS)

    def _abort(self):
        if self._communicator is not None:
            self._communicator.abort()
            self._communicator = None

    def _falls_back(self, buf, op):
        return buf.dtype.name not in self._types or self.rank_ordered and reduction.order_sensitive(op, buf.dtype)

    def allreduce(self, buf, op, source=None):
        if self._falls_back(buf, op):
            return self.fallback.allreduce(buf, op, source)
        if buf.size == 0:  # the same on every rank: nothing to do anywhere
            return
        send = buf if source is None else source
        self._nccl().allReduce(send.data.ptr, buf.data.ptr, buf.size, self._types[buf.dtype.name], self._ops[op],
                               self.stream.ptr)

    def reducescatter(self, buf, offsets, op, source=None):
        """NCCL scatters equal blocks: uneven ones travel padded to the largest."""
        if self._falls_back(buf, op):
            return self.fallback.reducescatter(buf, offsets, op, source)
        send, rank, size = buf if source is None else source, self.comm.rank, self.comm.size
        counts = np.diff(offsets).tolist()
        block = max(counts)
        mine = buf[offsets[rank]:offsets[rank + 1]]
        if block == 0:
            return mine
        with self.stream:
            padded = send if counts == [block] * size else _padded(self.cupy, send, offsets, block)
            received = self.cupy.empty(block, buf.dtype)
        self._nccl().reduceScatter(padded.data.ptr, received.data.ptr, block, self._types[buf.dtype.name],
                                   self._ops[op], self.stream.ptr)
        with self.stream:
            mine[...] = received[:len(mine)]
        return mine

    def allgather(self, buf, offsets):
        """Every segment of `buf` from its rank; uneven segments travel padded to the largest."""
        if buf.dtype.name not in self._types:
            return self.fallback.allgather(buf, offsets)
        rank, size = self.comm.rank, self.comm.size
        counts = np.diff(offsets).tolist()
        block = max(counts)
        if block == 0:
            return
        with self.stream:
            gathered = buf if counts == [block] * size else self.cupy.empty(block * size, buf.dtype)
            if gathered is not buf:
                gathered[rank * block:rank * block + counts[rank]] = buf[offsets[rank]:offsets[rank + 1]]
        self._nccl().allGather(gathered[rank * block:].data.ptr, gathered.data.ptr, block,
                               self._types[buf.dtype.name], self.stream.ptr)
        if gathered is not buf:
            with self.stream:
                for other in range(size):
                    buf[offsets[other]:offsets[other + 1]] = gathered[other * block:other * block + counts[other]]

    def broadcast(self, buf, root):
        if buf.dtype.name not in self._types:
            return self.fallback.broadcast(buf, root)
        if buf.size == 0:
            return
        self._nccl().broadcast(buf.data.ptr, buf.data.ptr, buf.size, self._types[buf.dtype.name], root, self.stream.ptr)


def _padded(cupy, send, offsets, block):
    """`send`'s segments, each at the start of its own block of `block` elements."""
    padded = cupy.zeros(block * (len(offsets) - 1), send.dtype)
    for owner in range(len(offsets) - 1):
        lo, hi = offsets[owner], offsets[owner + 1]
        padded[owner * block:owner * block + hi - lo] = send[lo:hi]
    return padded


class CudaAwareMpi:
    """The MPI library's own collectives on device buffers (only where it takes them). MPI knows
    nothing of our stream, so each call first waits for the kernels queued on it. What MPI has no
    datatype for (bfloat16), and float sums and products that must add in rank order
    (`rank_ordered`), go through `staged`, which shares its stream."""

    def __init__(self, transport, staged, rank_ordered=False):
        self.stream, self.staged, self.rank_ordered = staged.stream, staged, rank_ordered
        self.mpi = MPIAlgorithms(transport)

    def synchronize(self):
        self.stream.synchronize()

    def _family(self, buf, op=None):
        """MPI's own collectives, waited for by the stream's kernels, or the staged family."""
        if buf.dtype.kind == "V" or (op is not None and self.rank_ordered and reduction.order_sensitive(op, buf.dtype)):
            return self.staged
        self.stream.synchronize()
        return self.mpi

    def allreduce(self, buf, op, source=None):
        self._family(buf, op).allreduce(buf, op, source)

    def reducescatter(self, buf, offsets, op, source=None):
        return self._family(buf, op).reducescatter(buf, offsets, op, source)

    def allgather(self, buf, offsets):
        self._family(buf).allgather(buf, offsets)

    def broadcast(self, buf, root):
        self._family(buf).broadcast(buf, root)


class Staged:
    """Device buffers through pinned host memory and the host algorithms (`host`).

    An allreduce goes in chunks: every download is queued at once on one copy stream, each
    chunk's host collective starts as soon as its own download is done, and its upload is queued
    on a second stream, so the copies of the other chunks overlap the collective of this one.
    `api` is the few CUDA calls this needs (CupyApi; the unit tests give a host stand-in).
    """

    def __init__(self, api, host, rank, chunk_bytes):
        self.api, self.host, self.rank, self.chunk_bytes = api, host, rank, chunk_bytes
        self.stream = api.stream()
        self._down, self._up = api.stream(), api.stream()
        self._pinned = Workspace(api.pinned)

    def synchronize(self):
        self.stream.synchronize()

    def _download(self, buf, lo=0, hi=None):
        """buf[lo:hi] in the staging memory (at the same offsets), once the stream's work is done."""
        host = self._pinned.get(buf.size, buf.dtype)
        self._down.wait(self.stream.record())
        self.api.download(buf[lo:hi], host[lo:hi], self._down)
        self._down.record().synchronize()
        return host

    def _upload(self, host, buf):
        self.api.upload(host, buf, self._up)
        self.stream.wait(self._up.record())  # what the stream queues next runs after the upload

    def allreduce(self, buf, op, source=None):
        host = self._pinned.get(buf.size, buf.dtype)
        send = buf if source is None else source
        chunk = max(1, self.chunk_bytes // buf.dtype.itemsize)
        spans = [(start, min(start + chunk, buf.size)) for start in range(0, buf.size, chunk)]
        self._down.wait(self.stream.record())  # the packing kernels finish before any download
        downloaded = []
        for lo, hi in spans:
            self.api.download(send[lo:hi], host[lo:hi], self._down)
            downloaded.append(self._down.record())
        for (lo, hi), done in zip(spans, downloaded, strict=True):
            done.synchronize()
            self.host.allreduce(host[lo:hi], op)
            self.api.upload(host[lo:hi], buf[lo:hi], self._up)
        self.stream.wait(self._up.record())

    def reducescatter(self, buf, offsets, op, source=None):
        mine = self.host.reducescatter(self._download(buf if source is None else source), offsets, op)
        segment = buf[offsets[self.rank]:offsets[self.rank + 1]]
        self._upload(mine, segment)
        return segment

    def allgather(self, buf, offsets):
        host = self._download(buf, offsets[self.rank], offsets[self.rank + 1])
        self.host.allgather(host, offsets)
        self._upload(host, buf)

    def broadcast(self, buf, root):
        host = self._download(buf) if self.rank == root else self._pinned.get(buf.size, buf.dtype)
        self.host.broadcast(host, root)
        if self.rank != root:
            self._upload(host, buf)


class CupyApi:
    """The CUDA calls Staged makes, through CuPy: streams, events, pinned memory, async copies."""

    def __init__(self, cupy):
        self.cupy = cupy

    def stream(self):
        return _Stream(self.cupy.cuda.Stream(non_blocking=True))

    def pinned(self, nbytes):
        return np.frombuffer(self.cupy.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)

    def download(self, device, host, stream):
        runtime = self.cupy.cuda.runtime
        runtime.memcpyAsync(host.ctypes.data, device.data.ptr, device.nbytes, runtime.memcpyDeviceToHost,
                            stream.ptr)

    def upload(self, host, device, stream):
        runtime = self.cupy.cuda.runtime
        runtime.memcpyAsync(device.data.ptr, host.ctypes.data, host.nbytes, runtime.memcpyHostToDevice,
                            stream.ptr)


class _Stream:
    """A CuPy stream that also enters as the current stream (`with stream:`), with record/wait
    named as Staged uses them."""

    def __init__(self, stream):
        self.cuda = stream
        self.ptr = stream.ptr

    def record(self):
        return self.cuda.record()

    def wait(self, event):
        self.cuda.wait_event(event)

    def synchronize(self):
        self.cuda.synchronize()

    def __enter__(self):
        return self.cuda.__enter__()

    def __exit__(self, *exc):
        return self.cuda.__exit__(*exc)
