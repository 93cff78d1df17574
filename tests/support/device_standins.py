"""Stand-ins for the GPU in the unit tests of the GPU path's logic: the few CUDA calls of the
staging transport and the CuPy calls of the device executor, done at once on host memory."""

import contextlib

import numpy as np

from ringreduce.algorithms import ring


class HostStandIn:
    """The CUDA calls Staged makes, done at once on host memory, with a log of their order."""

    def __init__(self, log):
        self.log = log

    def stream(self):
        return DoneStream()

    def pinned(self, nbytes):
        return np.zeros(nbytes, np.uint8)

    def download(self, device, host, stream):
        self.log.append(("download", len(device)))
        host[...] = device

    def upload(self, host, device, stream):
        self.log.append(("upload", len(host)))
        device[...] = host


class DoneStream:
    """A stream whose work is done as soon as it is queued: every event is complete."""

    def record(self):
        return self

    def synchronize(self):
        pass

    def wait(self, event):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class LoggedRing:
    """The host family Staged hands its chunks to: the ring over the thread transport."""

    def __init__(self, transport, log):
        self.transport, self.log = transport, log

    def allreduce(self, buf, op, source=None):
        self.log.append(("allreduce", len(buf)))
        ring.allreduce(self.transport, buf, np.add, np.empty(len(buf) + 1, buf.dtype), 4)

    def reducescatter(self, buf, offsets, op, source=None):
        ring.reduce_scatter(self.transport, buf, offsets, np.add, np.empty(len(buf) + 1, buf.dtype), 4)
        return buf[offsets[self.transport.rank]:offsets[self.transport.rank + 1]]

    def allgather(self, buf, offsets):
        ring.allgather(self.transport, buf, offsets)

    def broadcast(self, buf, root):
        ring.allgather(self.transport, buf, [0 if r <= root else len(buf) for r in range(self.transport.size + 1)])


class NumpyAsCupy:
    """The CuPy functions DeviceExecutor calls, on numpy; its one kernel is the same formula
    (y = x * factor in y's dtype, through double) run on the host."""

    empty = staticmethod(np.empty)
    full = staticmethod(np.full)

    @staticmethod
    def ElementwiseKernel(inputs, outputs, body, name):  # noqa: N802  (CuPy's name)
        assert body == "y = (U)((double)x * factor)", body

        def scaled_cast(x, factor, y):
            np.copyto(y, x.astype(np.float64) * factor, casting="unsafe")

        return scaled_cast


def no_device(array):
    return contextlib.nullcontext()
