"""The collectives on arrays: each `*_async` call checks its arguments, hands a request to the
engine and returns a handle; each plain call waits for its handle.

Arguments that are wrong on one rank are not raised at once: the request still goes to the
negotiation with the problem attached, so that every rank raises the same error together
instead of the others waiting forever. Out-of-place calls write a new array; the input must
not change until the handle is done. The in-place forms write into the array they are given.
"""

import sys
import threading
import time
import typing
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from ringreduce import ops, runtime
from ringreduce.engine.agreement import Message
from ringreduce.engine.call_sites import user_call_site
from ringreduce.engine.requests import Handle, Request, timed_out
from ringreduce.machine import backends, gpu
from ringreduce.numerics import arrays, reduction
from ringreduce.numerics import compression as compressions
from ringreduce.numerics.arrays import Array
from ringreduce.numerics.compression import Compression, CompressorLike
from ringreduce.ops import Average
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.resilience import preemption


def _allreduce_calls(in_place: bool):
    """The four allreduce calls, written once for both forms: out of place (`allreduce`, ...), or
    writing each result into the array it was given (`allreduce_`, ..., named with a trailing _)."""

    def allreduce_async(tensor: ArrayLike, op: ops.ReduceOp = Average, name: str | None = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        compression: CompressorLike = Compression.none,
                        process_set: ProcessSet = global_process_set) -> Handle:
        """Combine the arrays of all ranks (of `process_set`, a ProcessSet; None: the whole job)
        element-wise; every rank gets the result (the in-place form: in `tensor`, which must be
        writeable and C-contiguous)."""
        key = _checked_key(tensor, name, ("allreduce", op, prescale_factor, postscale_factor, compression), in_place)
        return _submit("allreduce", name, lambda domain: _reduction(
            tensor, op, prescale_factor, postscale_factor, compression, in_place=in_place), process_set,
            key, lambda: dict(input=tensor, output=tensor if in_place else None))

    def grouped_allreduce_async(tensors: Sequence[ArrayLike], op: ops.ReduceOp = Average, name: str | None = None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                compression: CompressorLike = Compression.none,
                                process_set: ProcessSet = global_process_set) -> Handle:
        """allreduce of several arrays submitted together (so they fuse); the handle gives a list."""
        return _grouped(lambda t, n: allreduce_async(t, op, n, prescale_factor, postscale_factor, compression,
                                                     process_set), tensors, name, process_set)

    def allreduce(tensor: ArrayLike, op: ops.ReduceOp = Average, name: str | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  compression: CompressorLike = Compression.none,
                  process_set: ProcessSet = global_process_set) -> Array:
        """allreduce_async waited for: the combined array."""
        return _plain(lambda n: allreduce_async(tensor, op, n, prescale_factor, postscale_factor, compression,
                                                process_set), tensor, name, process_set,
                      ("allreduce", op, prescale_factor, postscale_factor, compression),
                      lambda domain: (tensor, tensor if in_place else None), in_place)

    def grouped_allreduce(tensors: Sequence[ArrayLike], op: ops.ReduceOp = Average, name: str | None = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          compression: CompressorLike = Compression.none,
                          process_set: ProcessSet = global_process_set) -> list[Array]:
        """grouped_allreduce_async waited for: the list of combined arrays."""
        return _synchronously(lambda: grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor,
                                                              compression, process_set), process_set, in_order=False)

    calls = allreduce_async, grouped_allreduce_async, allreduce, grouped_allreduce
    for call in calls:
        call.__name__ = call.__qualname__ = call.__name__ + ("_" if in_place else "")
    return calls


allreduce_async, grouped_allreduce_async, allreduce, grouped_allreduce = _allreduce_calls(in_place=False)
allreduce_async_, grouped_allreduce_async_, allreduce_, grouped_allreduce_ = _allreduce_calls(in_place=True)


def grouped_allgather_async(tensors: Sequence[ArrayLike], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """allgather of several arrays submitted together; the handle gives a list."""
    return _grouped(lambda t, n: allgather_async(t, n, process_set), tensors, name, process_set)


def grouped_reducescatter_async(tensors: Sequence[ArrayLike], op: ops.ReduceOp = Average, name: str | None = None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                process_set: ProcessSet = global_process_set) -> Handle:
    """reducescatter of several arrays submitted together; the handle gives a list."""
    return _grouped(lambda t, n: reducescatter_async(t, op, n, prescale_factor, postscale_factor, process_set),
                    tensors, name, process_set)


def reducescatter_async(tensor: ArrayLike, op: ops.ReduceOp = Average, name: str | None = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set: ProcessSet = global_process_set) -> Handle:
    """Combine the arrays of all ranks and give each rank its share of the first dimension, split
    as evenly as possible with the first ranks taking one more row (as Horovod)."""
    return _submit("reducescatter", name, lambda domain: _reduction(
        _with_rows(arrays.as_array(tensor), "reducescatter"), op, prescale_factor, postscale_factor,
        Compression.none, in_place=False), process_set)


def allgather_async(tensor: ArrayLike, name: str | None = None, process_set: ProcessSet = global_process_set) -> Handle:
    """Concatenate the arrays of all ranks along the first dimension, which may differ by rank."""
    return _submit("allgather", name, lambda domain: _gathered(_with_rows(arrays.as_array(tensor), "allgather")),
                   process_set)


def broadcast_async(tensor: ArrayLike, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Every rank gets a copy of the root rank's array (`root_rank` is a rank of the job, as in
    Horovod, also with a process set)."""
    return _submit("broadcast", name, lambda domain: _broadcast(tensor, root_rank, domain, in_place=False),
                   process_set)


def broadcast_async_(tensor: ArrayLike, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """broadcast_async into `tensor` (writeable and C-contiguous) on every rank."""
    return _submit("broadcast", name, lambda domain: _broadcast(tensor, root_rank, domain, in_place=True),
                   process_set)


def alltoall_async(tensor: ArrayLike, splits: ArrayLike | None = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set, return_splits: bool | None = None) -> Handle:
    """Send block j of the first dimension to rank j; receive and concatenate one block per rank.

    Without `splits` the first dimension is divided equally. With `splits` (rows per
    destination rank) the result is (array, rows received from each rank), as Horovod;
    `return_splits` asks for that pair or not, whichever the splits (the rows received are
    what a gradient sends back).
    """
    pair = splits is not None if return_splits is None else return_splits
    return _submit("alltoall", name, lambda domain: _alltoall(tensor, splits, domain, pair), process_set)


def grouped_allgather(tensors: Sequence[ArrayLike], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[Array]:
    return _synchronously(lambda: grouped_allgather_async(tensors, name, process_set), process_set, in_order=False)


def grouped_reducescatter(tensors: Sequence[ArrayLike], op: ops.ReduceOp = Average, name: str | None = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set: ProcessSet = global_process_set) -> list[Array]:
    return _synchronously(lambda: grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor,
                                                              process_set), process_set, in_order=False)


def reducescatter(tensor: ArrayLike, op: ops.ReduceOp = Average, name: str | None = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> Array:
    return _plain(lambda n: reducescatter_async(tensor, op, n, prescale_factor, postscale_factor, process_set),
                  tensor, name, process_set, ("reducescatter", op, prescale_factor, postscale_factor),
                  lambda domain: (tensor, None))


def allgather(tensor: ArrayLike, name: str | None = None, process_set: ProcessSet = global_process_set) -> Array:
    return _plain(lambda n: allgather_async(tensor, n, process_set), tensor, name, process_set, ("allgather",),
                  lambda domain: (tensor, None))


def broadcast(tensor: ArrayLike, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Array:
    return _plain(lambda n: broadcast_async(tensor, root_rank, n, process_set), tensor, name, process_set,
                  ("broadcast", root_rank), lambda domain: _broadcast_arrays(tensor, root_rank, domain))


def broadcast_(tensor: ArrayLike, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> Array:
    return _plain(lambda n: broadcast_async_(tensor, root_rank, n, process_set), tensor, name, process_set,
                  ("broadcast", root_rank), lambda domain: (None, tensor), in_place=True)


def alltoall(tensor: ArrayLike, splits: ArrayLike | None = None, name: str | None = None,
             process_set: ProcessSet = global_process_set,
             return_splits: bool | None = None) -> Array | tuple[Array, Array]:
    return _synchronously(lambda: alltoall_async(tensor, splits, name, process_set, return_splits), process_set)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return only when every rank (of `process_set`) has called barrier."""
    _synchronously(lambda: _submit("barrier", None, lambda domain: ({}, {}), process_set), process_set)


def join(device: int = -1, process_set: ProcessSet = global_process_set) -> int:
    """Say this rank has no more data. Until every rank (of `process_set`: an extension, Horovod's
    join has none) has joined, it takes part in the others' allreduces with the op's identity
    (zero for Sum and Average), so they do not hang. Returns the rank that joined last. Average
    still divides by the number of ranks.

    `device` is Horovod's argument (where its stand-in zeros live); ringreduce makes a joined
    rank's stand-ins where the collective's own arrays live, so it needs none, and accepts it."""
    if not isinstance(device, (int, np.integer)):
        raise TypeError(f"join(device=...) takes a device index (-1: CPU), got {device!r}")
    domain = runtime.active().domain(process_set)
    handle = Handle("join", domain.engine.waiters)
    domain.engine.join(handle)
    if domain.ordered is not None:
        domain.ordered.answer_as_joined(handle)
    return domain.ranks[handle.wait()]


def stop_requested(within: float | None = None) -> bool:
    """True on every rank once any rank has been told to stop (SIGUSR1, which rrun passes on from a
    scheduler's preemption notice; SIGTERM, from rrun or Slurm, once the program has asked), or,
    with `within`, once the job's time limit (Slurm's SLURM_JOB_END_TIME) is at most `within`
    seconds away on any rank: a loop that asks every few minutes still commits in time. A
    collective: every rank calls it at the same point, and on True commits a checkpoint and exits,
    within the scheduler's grace period."""
    flag = np.array([preemption.near_end(within)], dtype=np.uint8)
    return bool(allreduce(flag, op=ops.Max, name="ringreduce.stop_requested")[0])


def poll(handle: Handle) -> bool:
    """True once the request behind `handle` is done (synchronize will not wait)."""
    return handle.done()


def synchronize(handle: Handle) -> typing.Any:
    """Wait for the request behind `handle`; return its result or raise its error."""
    return handle.wait()


def _grouped(submit, tensors, name, process_set):
    """submit(array, name) for each array, named `{name}.{i}` (the naming rule of every grouped
    call), together, so that they fuse."""
    base = name or _unnamed(runtime.active().domain(process_set))
    return GroupHandle([submit(t, n) for t, n in zip(tensors, grouped_names(base, len(tensors)), strict=True)])


def grouped_names(base, count):
    """The names of a grouped call's members (None without a base name)."""
    return [None if base is None else f"{base}.{i}" for i in range(count)]


class GroupHandle:
    """The handle of a grouped call: done when every member is; its result is the list."""

    def __init__(self, handles):
        self.handles = handles

    def done(self):
        return all(h.done() for h in self.handles)

    def wait(self, timeout: float | None = None):
        """Every member's result; a TimeoutError once `timeout` seconds have passed in all."""
        if timeout is None:
            return [h.wait() for h in self.handles]
        deadline, results = time.monotonic() + timeout, []
        for handle in self.handles:
            try:
                results.append(handle.wait(max(0.0, deadline - time.monotonic())))
            except TimeoutError:  # its share of the timeout ran out: the caller gave the whole
                raise timed_out(handle.name, timeout) from None
        return results


# .plain, in a plain call: (domain, numbers of its waiting names held, whether it meets the others in
# program order, and the key under which to remember its checked Message, or None)
_calling = threading.local()


def _plain(submit, tensor, name, process_set, arguments, arrays_of, in_place=False):
    """submit(name) waited for. A plain call of a numpy array whose arguments passed the checks in
    an earlier call (one that ran in program order, or an async allreduce: _checked_key) meets the
    others at once with that call's checked Message: arrays_of(domain) gives the (input, output)
    the meeting runs it on, as the call's checks would have made them. The first such call goes the
    whole way, and its Message is remembered."""
    active = runtime.active()
    domain = active.domain(process_set)
    if domain.ordered is None or type(tensor) is not np.ndarray:
        return _synchronously(lambda: submit(name), process_set)
    number, plain_name = (None, name) if name else domain.waiting_name()
    try:
        key = _checked_key(tensor, plain_name, arguments, in_place)
        message = domain.checked_message(key)
        if message is None:
            return _synchronously(lambda: submit(plain_name), process_set, remember=key)
        recorder, caller = active.flight_recorder, sys._getframe(2)  # the plain call's caller
        flight = recorder.record(message, domain.set_id, caller=(caller.f_code, caller.f_lineno))
        done, result = domain.ordered.run(message, *arrays_of(domain))
        recorder.finished(flight)
        # Not done: checked, but a rank has joined since this call last came; the engine runs it, no meeting again.
        return result if done else _synchronously(lambda: submit(plain_name), process_set, in_order=False)
    finally:
        if number is not None:
            domain.release([number])


def _checked_key(tensor, name, arguments, in_place):
    """The key under which a call's checked Message is kept (Domain.checked): all that its checks
    read, that is the kind and other `arguments`, the name, the array's dtype and shape, and for the
    in-place form whether it is writeable and contiguous. None where the checks read more (an
    array other than numpy's) or the call is unnamed (an async call's name is counted, never
    the same again)."""
    if not name or type(tensor) is not np.ndarray:
        return None
    writes_into = in_place and tensor.flags.writeable and tensor.flags.c_contiguous
    return (name, tensor.dtype, tensor.shape, writes_into, *arguments)


def _synchronously(start, process_set, in_order=True, remember=None):
    """Start a request (start() returns its handle) and wait for it. A single plain call first
    meets the other ranks' in program order, where its domain does so (engine/plain_calls.py), which
    runs a small allreduce, reducescatter, allgather or broadcast, or a barrier, there and then,
    and a larger one of those right after on this thread (and its Message is kept under
    `remember`, see _plain); the engine gets the rest. The engine thread is not woken for
    them: this thread runs the cycles itself while no other thread runs one, which spares a small
    call two thread hand-offs (the engine thread's wake-up and this one's)."""
    domain, held = runtime.active().domain(process_set), []
    _calling.plain = (domain, held, in_order and domain.ordered is not None, remember)
    try:
        try:
            handle = start()
        finally:
            _calling.plain = None
        return handle.result if type(handle) is Finished else domain.engine.wait_for(handle)
    finally:
        domain.release(held)


def _unnamed(domain):
    """The name of an unnamed call: a plain call's repeats (see Domain.waiting_name), an async
    call's is counted."""
    plain = getattr(_calling, "plain", None)
    if plain is None or plain[0] is not domain:
        return domain.auto_name()
    number, name = domain.waiting_name()
    plain[1].append(number)
    return name


def _submit(kind, name, build, process_set, key=None, arrays_of=None):
    """Check the arguments (build(domain) returns the Message fields and the Request's arrays) and
    enqueue to the engine of `process_set`'s domain, unless a plain call's meeting in program order
    has run it already. Invalid arguments become the Message's problem, which every rank raises.
    An async call under a `key` (_checked_key) whose arguments passed the checks before is sent
    with that Message (a step's gradients come again and again: the checks cost 3 us a call):
    arrays_of() gives its Request's arrays, as the checks would."""
    domain = runtime.active().domain(process_set)
    plain = getattr(_calling, "plain", None)
    name = name or _unnamed(domain)
    message = domain.checked_message(key) if key is not None and plain is None else None
    if message is not None:
        frame = sys._getframe(2)  # the async call's caller, whose line the kept Message may not name
        data, caller = arrays_of(), (frame.f_code, frame.f_lineno)
    else:
        caller = None
        try:
            fields, data = build(domain)
            if fields.get("device") == "cuda":  # the engine's GPU work waits for the caller's, not the device
                data["ready"] = gpu.ready_event()
            message = Message(name=name, kind=kind, site=user_call_site(), **fields)
        except (TypeError, ValueError) as error:
            message, data = Message(name=name, kind=kind, problem=(type(error).__name__, str(error)),
                                    site=user_call_site()), {}
        if key is not None and plain is None and message.problem is None:
            domain.remember_checked(key, message)
    recorder = runtime.active().flight_recorder
    flight = recorder.record(message, domain.set_id, caller=caller)
    if plain is not None and plain[2] and plain[0] is domain:
        done, result = domain.ordered.run(message, data.get("input"), data.get("output"))
        if done:
            recorder.finished(flight)
            if plain[3] is not None:
                domain.remember_checked(plain[3], message)
            return Finished(result)
    handle = Handle(name, domain.engine.waiters)
    recorder.started_as(flight, handle)
    domain.engine.submit(Request(message, handle, **data), wake=plain is None)
    return handle


class Finished(typing.NamedTuple):
    """The handle of a plain call that ran in program order: done at once."""

    result: object

    def done(self):
        return True

    def wait(self, timeout: float | None = None):
        return self.result


def _reduction(tensor, op, prescale_factor, postscale_factor, compression, in_place):
    """Checked reduction arguments."""
    array = arrays.writable_in_place(tensor, "allreduce_") if in_place else arrays.as_array(tensor)
    arrays.check_dtype(array)
    op = ops.as_op(op)
    prescale, postscale = float(prescale_factor), float(postscale_factor)
    reduction.check_op(op, array.dtype, prescale, postscale)
    fields = _about(array, op=op, prescale=prescale, postscale=postscale,
                    compression=compressions.check(compression))
    if fields["compression"] == "bf16" and fields["device"] == "cuda":
        arrays.require_device_bfloat16(array, "Compression.bf16 on a GPU array")
    # Out of place, the engine allocates the result when it runs (a fused group's results share one block).
    return fields, dict(input=array, output=array if in_place else None)


def _about(array, **fields):
    """The Message fields that describe a call's array, which every rank's must match."""
    return dict(dtype=arrays.dtype_name(array.dtype), shape=array.shape, device=backends.device_of(array), **fields)


def _gathered(array):
    arrays.check_dtype(array)
    return _about(array), dict(input=array)


def _broadcast(tensor, root_rank, domain, in_place):
    array = arrays.writable_in_place(tensor, "broadcast_") if in_place else arrays.as_array(tensor)
    arrays.check_dtype(array)
    if not isinstance(root_rank, (int, np.integer)) or root_rank not in domain.ranks:
        where = (f"of this job (0 to {len(domain.ranks) - 1})" if domain.set_id == 0
                 else f"in {domain.describe()}")
        raise ValueError(f"root_rank {root_rank!r} is not a rank {where}")
    fields = _about(array, root=domain.ranks.index(root_rank))  # the engine's own rank numbers
    if in_place:
        return fields, dict(output=array)
    source, output = _broadcast_arrays(array, root_rank, domain)
    return fields, dict(input=source, output=output)


def _broadcast_arrays(array, root_rank, domain):
    """(input, output) of an out-of-place broadcast: the root's values go out from its input, and
    into its new array on the way (a device root's is a copy of its input, sent from there)."""
    is_root = domain.ranks[domain.engine.rank] == root_rank
    if is_root and backends.on_device(array):
        return None, backends.device_copy(array)
    return (array if is_root else None), backends.new_like(array)


def _alltoall(tensor, splits, domain, return_splits):
    array = _with_rows(arrays.as_array(tensor), "alltoall")
    arrays.check_dtype(array)
    counts = _split_counts(array, splits, domain.engine.size)
    return (_about(array),
            dict(input=array, splits=counts, return_splits=return_splits))


def _with_rows(array, what):
    if array.ndim == 0:
        raise ValueError(f"{what} needs an array with at least one dimension, got a scalar")
    return array


def _split_counts(array, splits, size):
    """The rows `alltoall` sends to each rank, from `splits` or an equal division."""
    rows = array.shape[0]
    if splits is None:
        if rows % size:
            raise ValueError(
                f"alltoall without splits needs a first dimension ({rows}) divisible by the "
                f"number of ranks ({size}); pass splits to divide it unevenly")
        return [rows // size] * size
    counts = np.asarray(splits).reshape(-1)
    if not np.issubdtype(counts.dtype, np.integer) or len(counts) != size:
        raise ValueError(f"alltoall splits must be {size} whole numbers, one per rank, got {splits!r}")
    if (counts < 0).any() or counts.sum() != rows:
        raise ValueError(
            f"alltoall splits {counts.tolist()} must be non-negative and add up to the first "
            f"dimension ({rows})")
    return counts.tolist()
