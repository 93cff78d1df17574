"""Point-to-point transfers with torch.distributed's names: send, recv, isend, irecv.

They bypass the engine: only two ranks take part, so there is nothing to negotiate. Each process
set has a communicator of its own for them, used by the calling threads only, so a transfer never
interleaves with the engine's collectives and cannot deadlock with collectives pending on the same
ranks. A transfer is a rendezvous: the sender's header (dtype, shape and a channel of its own), the
receiver's answer (accepted, or the mismatch), then the data on that channel. So a mismatch of
dtype or shape is the same error on both ends, and a blocking send returns only once the receiver
has taken the data (as MPI_Ssend): exchange with isend/irecv, as with torch.distributed.

Messages between the same two ranks with the same tag arrive in the order they were sent: the
header is posted on the calling thread, the rest may finish on another (the async forms).
"""

import itertools
import threading

import numpy as np
from mpi4py import MPI
from numpy.typing import ArrayLike

from ringreduce import runtime
from ringreduce.engine.requests import timed_out
from ringreduce.errors import MismatchError
from ringreduce.machine import backends
from ringreduce.numerics import arrays
from ringreduce.process_sets import ProcessSet, global_process_set

MAX_TAG = (1 << 20) - 1  # user tags; the channels lie above them, below every MPI's MPI_TAG_UB
_CHANNELS = 1 << 21  # channel numbers in flight at once from one rank
_MAX_DIMS = 8
_DTYPES = [dtype.name for dtype in arrays.SUPPORTED_DTYPES] + [arrays.DEVICE_ONLY]
_CODES = {name: code for code, name in enumerate(_DTYPES)}
_ACCEPTED = 1
_channel_numbers = itertools.count()
_channel_lock = threading.Lock()


def send(tensor: ArrayLike, dst: int, process_set: ProcessSet = global_process_set, tag: int = 0) -> None:
    """Send `tensor` to global rank `dst`; returns once `dst` has received it."""
    _Send(tensor, dst, process_set, tag).finish()


def recv(tensor: ArrayLike, src: int | None = None, process_set: ProcessSet = global_process_set, tag: int = 0) -> int:
    """Receive into `tensor` (same dtype and shape as sent) from global rank `src`, or from any rank
    of the set with `src=None`; returns the sender's global rank."""
    return _Recv(tensor, src, process_set, tag).finish()


def isend(tensor: ArrayLike, dst: int, process_set: ProcessSet = global_process_set, tag: int = 0) -> "Work":
    """send, returning at once a handle whose wait() returns when it is done (or raises)."""
    return Work(_Send(tensor, dst, process_set, tag))


def irecv(tensor: ArrayLike, src: int | None = None, process_set: ProcessSet = global_process_set,
          tag: int = 0) -> "Work":
    """recv, returning at once a handle; its wait() returns the sender's global rank."""
    return Work(_Recv(tensor, src, process_set, tag))


class Work:
    """A transfer finishing on a thread of its own; `wait()` and `is_completed()` as
    torch.distributed's, `done()` so that poll() and synchronize() take it too."""

    def __init__(self, transfer):
        self._result, self._error = None, None
        self._described = transfer.describe()
        self._thread = threading.Thread(target=self._run, args=(transfer,), daemon=True,
                                        name="ringreduce-point-to-point")
        self._thread.start()

    def _run(self, transfer):
        try:
            self._result = transfer.finish()
        except BaseException as error:  # noqa: BLE001 - raised again from wait()
            self._error = error

    def is_completed(self) -> bool:
        return not self._thread.is_alive()

    done = is_completed

    def wait(self, timeout: float | None = None) -> int | bool | None:
        """The sender's rank for a receive; a TimeoutError after `timeout` seconds unfinished (as
        torch's gloo raises)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise timed_out(self._described, timeout)
        if self._error is not None:
            raise self._error
        return self._result


class _Transfer:
    def __init__(self, tensor, peer, process_set, tag, what, writes):
        if not isinstance(tag, (int, np.integer)) or not 0 <= tag <= MAX_TAG:
            raise ValueError(f"{what}: tag must be a whole number from 0 to {MAX_TAG}, got {tag!r}")
        domain = runtime.active().domain(process_set)
        self.comm, self.ranks, self.tag, self.what = domain.peer_comm, domain.ranks, int(tag), what
        self.me = domain.ranks[self.comm.rank]
        if peer is not None and (not isinstance(peer, (int, np.integer)) or peer not in domain.ranks
                                 or peer == self.me):
            where = "this job" if domain.set_id == 0 else domain.describe()
            raise ValueError(f"{what}: rank {peer!r} is not another rank of {where}")
        self.array = arrays.as_array(tensor)
        if writes and (self.array is not tensor or not getattr(self.array.flags, "writeable", True)):
            raise ValueError(f"{what} receives into a writeable numpy or CuPy array, got {type(tensor).__name__}"
                             + (" (read-only)" if self.array is tensor else ""))
        arrays.check_dtype(self.array)
        if self.array.ndim > _MAX_DIMS:
            raise ValueError(f"{what}: at most {_MAX_DIMS} dimensions, got {self.array.ndim}")

    def describe(self):
        peer = "any rank" if self.peer is None else f"rank {self.ranks[self.peer]}"
        return f"{self.what} {'to' if self.what == 'send' else 'from'} {peer} with tag {self.tag}"

    def header(self, channel):
        shape = list(self.array.shape) + [0] * (_MAX_DIMS - self.array.ndim)
        code = _CODES[arrays.dtype_name(self.array.dtype)]
        return np.array([code, self.array.ndim, channel, *shape], dtype=np.int64)

    def mismatch(self, sent, received, sender, receiver):
        """The same text on both ends."""
        return MismatchError(f"send/recv with tag {self.tag} does not match: rank {sender} sends "
                             f"{_describe(sent)} but rank {receiver} receives into {_describe(received)}")


class _Send(_Transfer):
    def __init__(self, tensor, dst, process_set, tag):
        super().__init__(tensor, dst, process_set, tag, "send", writes=False)
        self.peer = self.ranks.index(dst)
        # Above the user's tags; even from the lower rank of the pair to the higher, odd the other
        # way, so that two ranks sending to each other never share a channel.
        with _channel_lock:
            number = next(_channel_numbers) % _CHANNELS
        channel = MAX_TAG + 1 + 2 * number + (self.peer < self.comm.rank)
        self.sent = self.header(channel)
        self.request = self.comm.Isend(self.sent, self.peer, self.tag)  # posted here: the order of sends

    def finish(self):
        self.request.Wait()
        answer = np.empty_like(self.sent)
        channel = int(self.sent[2])
        self.comm.Recv(answer, self.peer, channel)
        if answer[0] != _ACCEPTED:
            raise self.mismatch(self.sent, answer, self.me, self.ranks[self.peer])
        self.comm.Send(_bytes(np.ascontiguousarray(backends.to_host(self.array))), self.peer, channel)


class _Recv(_Transfer):
    def __init__(self, tensor, src, process_set, tag):
        super().__init__(tensor, src, process_set, tag, "recv", writes=True)
        self.received = np.empty(3 + _MAX_DIMS, dtype=np.int64)
        self.peer = None if src is None else self.ranks.index(src)
        source = MPI.ANY_SOURCE if self.peer is None else self.peer
        self.request = self.comm.Irecv(self.received, source, self.tag)  # posted here: the order of receives

    def finish(self):
        status = MPI.Status()
        self.request.Wait(status)
        sender, channel = status.Get_source(), int(self.received[2])
        mine = self.header(channel)
        accepted = np.array_equal(mine[:2], self.received[:2]) and np.array_equal(mine[3:], self.received[3:])
        answer = mine.copy()
        answer[0] = _ACCEPTED if accepted else -1 - mine[0]
        self.comm.Send(answer, sender, channel)
        if not accepted:
            raise self.mismatch(self.received, mine, self.ranks[sender], self.me)
        host = self.array if isinstance(self.array, np.ndarray) and self.array.flags.c_contiguous else \
            np.empty(self.array.shape, self.array.dtype)
        self.comm.Recv(_bytes(host), sender, channel)
        if host is not self.array:
            self.array[...] = backends.like(host, self.array)
        return self.ranks[sender]


def _bytes(array):
    """A C-contiguous array's memory as bytes: MPI has no datatype for bfloat16."""
    return array.reshape(-1).view(np.uint8)


def _describe(header):
    code = int(header[0])
    code = code if code >= 0 else -1 - code
    return f"{_DTYPES[code]} {tuple(int(d) for d in header[3:3 + int(header[1])])}"
