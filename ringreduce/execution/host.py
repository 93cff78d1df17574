"""Running what the ranks agreed on: one collective per fusion group, on the engine thread.

Each function gets the group's responses and this rank's requests for them (None where this
rank has joined and takes part with the op's identity), runs the algorithm, and returns one
result per request. The host algorithms work on numpy arrays; collectives of CuPy arrays run
on the GPU (execution/device.py), except alltoall, which stages them through the host.
"""

import functools
import math
import time

import numpy as np

from ringreduce import ops
from ringreduce.execution.device import DeviceExecutor
from ringreduce.execution.packing import pack
from ringreduce.machine import gpu
from ringreduce.machine.backends import like, new_like, to_host
from ringreduce.machine.layout import Concatenation, disjoint, even_counts, offsets_of
from ringreduce.machine.memory import RECYCLER, Workspace
from ringreduce.numerics import compression, reduction

# Collectives that run on the GPU for CuPy arrays; alltoall stages them through the host.
DEVICE_KINDS = ("allreduce", "allgather", "broadcast", "reducescatter")


class Executor:
    def __init__(self, algorithms, rank, size, timeline, device_family=None):
        """`device_family()` builds the agreed transport for CuPy arrays, at the first one."""
        self.algorithms = algorithms
        self.rank, self.size = rank, size
        self.timeline = timeline
        self.fusion_buffer = Workspace()  # grown once, reused for every fused group
        self.workspace = Workspace()  # reducescatter's copy of its input
        self._device_family = device_family
        self._device = None

    def run(self, responses, requests):
        """Results for the requests (None for a joined rank's stand-in), or raise."""
        kind = responses[0].message.kind
        on_gpu = responses[0].message.device == "cuda" and kind in DEVICE_KINDS
        if kind == "allreduce" and not on_gpu:
            return self._allreduce(responses, requests)  # its timeline phases are its own
        started = time.perf_counter()
        if kind == "allreduce":
            results = self._on_device().allreduce(responses, requests, _sent_dtype(responses[0].message))
            finished = time.perf_counter()
            for response in responses:
                self.timeline.phase(response.name, "ALLREDUCE", started, finished)
            return results
        (response,), (request,) = responses, requests
        if on_gpu:
            result = getattr(self._on_device(), kind)(response, request)
        else:
            result = getattr(self, "_" + kind)(response, request)
        self.timeline.phase(response.name, kind.upper(), started, time.perf_counter())
        return [result]

    def _on_device(self):
        if self._device is None:
            self._device = DeviceExecutor(gpu.require_cupy("a CuPy array"), self._device_family, self.rank, self.size)
        return self._device

    def _allreduce(self, responses, requests):
        """A fused group of allreduces: its inputs read where they lie or packed, reduced, the
        results handed out or written where they go."""
        message = responses[0].message
        sent_dtype = _sent_dtype(message)
        uncompressed = sent_dtype == np.dtype(message.dtype)
        if len(responses) == 1 and uncompressed:
            return self._allreduce_alone(responses[0], requests[0], message.op)
        offsets = offsets_of([r.message.count for r in responses])
        new_results = uncompressed and all(r is None or r.output is None for r in requests)
        started = time.perf_counter()
        where_they_lie = uncompressed and self._reads_where_they_lie(requests, message, sent_dtype, offsets[-1],
                                                                     new_results)
        if where_they_lie:
            # The algorithm reads each piece where it lies: nothing is packed at all.
            source = Concatenation([(r.input if r is not None else _identity(m.message, message.op)).reshape(-1)
                                    for m, r in zip(responses, requests, strict=True)])
        else:
            source = self.fusion_buffer.get(offsets[-1], sent_dtype)
            pack(source, offsets, requests, message.op,
                 lambda array, piece: reduction.scale(array, message.prescale, out=piece))
        copied_in = time.perf_counter()
        outputs, reduced = self._reduce_fused(responses, requests, source, offsets, new_results, where_they_lie,
                                              uncompressed)
        done = time.perf_counter()
        for response in responses:
            self.timeline.phase(response.name, "MEMCPY_IN_FUSION_BUFFER", started, copied_in)
            self.timeline.phase(response.name, "ALLREDUCE", copied_in, reduced)
            self.timeline.phase(response.name, "MEMCPY_OUT_FUSION_BUFFER", reduced, done)
        return outputs

    def _reduce_fused(self, responses, requests, source, offsets, new_results, where_they_lie, uncompressed):
        """(the group's results, when the reduction ended), from its fused `source`."""
        message = responses[0].message
        op = message.op
        scale_result = _result_scaler(op, self.size, message.postscale)
        if new_results:
            # Every result is new: reduce straight into one recycled block and hand out views of
            # it, which saves unpacking a fusion buffer.
            block = RECYCLER.empty((offsets[-1],), message.dtype)
            self.algorithms.allreduce(block, op, source, scale_result)
            return ([block[offsets[i]:offsets[i + 1]].reshape(r.message.shape) for i, r in enumerate(responses)],
                    time.perf_counter())
        outputs = [_output_for(r, m.message, op) for m, r in zip(responses, requests, strict=True)]
        if where_they_lie:
            # ... and writes each result where it goes (the gradients of a training step, reduced in
            # place): nothing is unpacked either.
            self.algorithms.allreduce(Concatenation([o.reshape(-1) for o in outputs]), op, source, scale_result)
            return outputs, time.perf_counter()
        # Compressed, the division waits for the cast back, as it would without compression.
        self.algorithms.allreduce(source, op, scale_result=scale_result if uncompressed else None)
        reduced = time.perf_counter()
        for index, output in enumerate(outputs):
            reduction.scale(source[offsets[index]:offsets[index + 1]].reshape(output.shape), 1.0, out=output)
            if not uncompressed:
                reduction.scale_result(output.reshape(-1), op, self.size, message.postscale)
        return outputs, reduced

    def _reads_where_they_lie(self, requests, message, sent_dtype, count, new_results):
        """Can the algorithm read every (uncompressed) input where it lies, and write the results
        there too unless they are all new? Unscaled, contiguous inputs on the shared-memory path;
        and results written into the inputs must not land where another request still reads."""
        return (message.prescale == 1.0 and self.algorithms.reads_concatenation_at(count * sent_dtype.itemsize)
                and all(r is None or _readable_as(r.input, sent_dtype) for r in requests)
                and (new_results or disjoint([r.input for r in requests if r is not None])))

    def _allreduce_alone(self, response, request, op):
        """One tensor, no compression: reduce straight into its output, no fusion buffer. An
        unscaled contiguous input is read where it is, not copied into the output first."""
        message = response.message
        started = time.perf_counter()
        output = _output_for(request, message, op)
        flat, source = output.reshape(-1), None
        if request is not None and request.input is not output:
            source = _contribution(request.input, output, message.prescale)
        elif request is not None:
            reduction.scale(flat, message.prescale)
        self.algorithms.allreduce(flat, op, source, _result_scaler(op, self.size, message.postscale))
        self.timeline.phase(response.name, "ALLREDUCE", started, time.perf_counter())
        return [output]

    def _allgather(self, response, request):
        message = response.message
        rows = [m.shape[0] for m in response.messages]
        row_offsets = offsets_of(rows)
        result = RECYCLER.empty((row_offsets[-1],) + message.shape[1:], message.dtype)
        result[row_offsets[self.rank]:row_offsets[self.rank + 1]] = request.input
        row_size = math.prod(message.shape[1:])
        self.algorithms.allgather(result.reshape(-1), [o * row_size for o in row_offsets])
        return result

    def _broadcast(self, response, request):
        """Into the request's output (C-contiguous), from the root's input where it has one: read
        where it lies when contiguous, else copied into the output first (one copy, not two)."""
        source = None if request.input is None else _contribution(request.input, request.output, 1.0)
        self.algorithms.broadcast(request.output.reshape(-1), response.message.root, source)
        return request.output

    def _alltoall(self, response, request):
        send_rows = np.array(request.splits, dtype=np.int64)
        received_rows = np.empty(self.size, dtype=np.int64)
        unit = list(range(self.size + 1))
        self.algorithms.alltoallv(send_rows, unit, received_rows, unit)
        if request.ready is not None:  # a device input: read once the caller's stream has made it
            request.ready.synchronize()
        array = to_host(request.input)
        row_size = math.prod(array.shape[1:])
        send = np.ascontiguousarray(array).reshape(-1)
        result = RECYCLER.empty((int(received_rows.sum()),) + array.shape[1:], array.dtype)
        self.algorithms.alltoallv(send, offsets_of(send_rows * row_size),
                                  result.reshape(-1), offsets_of(received_rows * row_size))
        result = like(result, request.input)
        return (result, received_rows) if request.return_splits else result

    def _reducescatter(self, response, request):
        message = response.message
        op = message.op
        rows = even_counts(message.shape[0], self.size)
        row_size = math.prod(message.shape[1:])
        work = self.workspace.get(math.prod(message.shape), message.dtype).reshape(message.shape)
        source = _contribution(request.input, work, message.prescale)
        mine = self.algorithms.reducescatter(work.reshape(-1), offsets_of([r * row_size for r in rows]), op, source)
        result = RECYCLER.empty((rows[self.rank],) + message.shape[1:], message.dtype)
        reduction.scale_result(mine, op, self.size, message.postscale, out=result.reshape(-1))  # the copy out too
        return result

    def _barrier(self, response, request):
        return None


def _sent_dtype(message):
    return compression.wire_dtype(message.compression, message.dtype)


def _result_scaler(op, size, postscale):
    """reduction.scale_result for the algorithms to run on each stretch of the result as it is reduced; None
    when the sums are the result already."""
    if op != ops.Average and postscale == 1.0:
        return None
    return functools.partial(reduction.scale_result, op=op, size=size, postscale_factor=postscale)


def _contribution(array, target, factor):
    """Where the algorithms read this rank's contribution: `array` itself, flat, when it needs no
    scaling and they can read it as it is; else None, after copying it, scaled, into `target`."""
    if factor == 1.0 and _readable_as(array, target.dtype):
        return array.reshape(-1)
    reduction.scale(array, factor, out=target)
    return None


def _readable_as(source, dtype):
    """Can the algorithms read `source` where it is, as elements of `dtype` (contiguous host array)?"""
    return isinstance(source, np.ndarray) and source.dtype == dtype and source.flags.c_contiguous


def _output_for(request, message, op):
    """Where a request's result goes: its own array (in place), a new one, or for a joined rank
    an array of the op's identity."""
    if request is None:
        return _identity(message, op)
    return request.output if request.output is not None else new_like(request.input)


def _identity(message, op):
    return np.full(message.shape, reduction.identity(op, message.dtype), dtype=message.dtype)
