"""Point-to-point transfers of tensors, with torch.distributed's names and argument order
(`process_set=` where torch.distributed has `group=`; ranks are global ranks, as there)."""

import torch
from ringreduce import point_to_point as core
from ringreduce.point_to_point import Work
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.torch import tensors


def send(tensor: torch.Tensor, dst: int, process_set: ProcessSet = global_process_set, tag: int = 0) -> None:
    """Send `tensor` to global rank `dst`; returns once it has been received."""
    core.send(tensors.as_array(tensor), dst, process_set, tag)


def recv(tensor: torch.Tensor, src: int | None = None, process_set: ProcessSet = global_process_set,
         tag: int = 0) -> int:
    """Receive into `tensor` from global rank `src` (any rank of the set with None); returns the
    sender's rank."""
    array, write_back = _receiving(tensor)
    sender = core.recv(array, src, process_set, tag)
    write_back()
    return sender


def isend(tensor: torch.Tensor, dst: int, process_set: ProcessSet = global_process_set, tag: int = 0) -> Work:
    """send, returning at once a handle with wait() and is_completed()."""
    return core.isend(tensors.as_array(tensor), dst, process_set, tag)


def irecv(tensor: torch.Tensor, src: int | None = None, process_set: ProcessSet = global_process_set,
          tag: int = 0) -> "_Received":
    """recv, returning at once a handle whose wait() returns the sender's rank once `tensor` holds
    the data."""
    array, write_back = _receiving(tensor)
    return _Received(core.irecv(array, src, process_set, tag), write_back)


def _receiving(tensor):
    """The array to receive into, and what puts it into `tensor` afterwards (bfloat16 travels as
    float32, so it needs copying back)."""
    array = tensors.as_array(tensor)
    if tensor.dtype != torch.bfloat16:
        return array, lambda: None
    return array, lambda: tensor.copy_(torch.from_numpy(array) if not tensor.is_cuda else torch.from_dlpack(array))


class _Received:
    def __init__(self, work, write_back):
        self._work, self._write_back = work, write_back

    def is_completed(self):
        return self._work.is_completed()

    done = is_completed

    def wait(self, timeout=None):
        sender = self._work.wait(timeout)
        self._write_back()
        return sender
