"""Running agreed collectives on CuPy arrays: the device side of execution/host.py.

Everything stays on the GPU: a fused group is packed into a device fusion buffer (grown once,
reused) with the prescale and the FP16 cast done by one kernel on the way in, and the cast
back, the average and the postscale by one kernel on the way out. The collective runs through
the transport the ranks agreed on (algorithms/device.py) on its stream; the kernels go on that
stream too, after the event each request recorded on its caller's stream, and results are
handed out once the stream is done.

The engine thread runs this, so every call enters the GPU that the first device request's
array lives on (CUDA's current device is per thread): one process, one GPU.
"""

import contextlib
import math

import numpy as np

from ringreduce.execution.packing import pack
from ringreduce.machine.layout import even_counts, offsets_of
from ringreduce.machine.memory import Workspace
from ringreduce.numerics import device_kernels, reduction
from ringreduce.ops import ReduceOp


class DeviceExecutor:
    def __init__(self, cupy, make_family, rank, size, device_of=None):
        """`make_family()` builds the agreed transport; it is called on the first device request,
        inside that request's GPU (`device_of(array)`; CUDA streams belong to a device)."""
        self.cupy, self.make_family = cupy, make_family
        self.device_of = device_of or self._device_of
        self.rank, self.size = rank, size
        self.device = self.family = None
        self.fusion_buffer = None

    @contextlib.contextmanager
    def _on_gpu(self, requests, make_results=lambda: None):
        """The work of one collective: on its GPU and stream, after the callers' work, and done
        (the stream synchronized) when the block ends. Yields what `make_results()` made, the
        arrays handed to the caller, made before the engine's stream is entered: CuPy's pool keeps
        a freed block for the stream it was made on, and a result made on the engine's would be
        reused by the next collective there while the caller's stream may still read it."""
        if self.device is None:
            first = next((r for r in requests if r is not None), None)  # none: this rank has joined
            self.device = self.device_of(None if first is None else
                                         first.input if first.input is not None else first.output)
            with self.device:
                self.family = self.make_family()
                self.fusion_buffer = Workspace(lambda nbytes: self.cupy.empty(nbytes, np.uint8))
                self._scaled_cast = device_kernels.scaled_cast(self.cupy)
        with self.device:
            results = make_results()
            with self.family.stream:
                for request in requests:
                    if request is not None and request.ready is not None:
                        self.family.stream.wait(request.ready)
                yield results
        self.family.synchronize()

    def _device_of(self, array):
        """The GPU an array lives on; for a joined rank, which has none, the current one."""
        return self.cupy.cuda.Device() if array is None else array.device

    def allreduce(self, responses, requests, wire):
        message = responses[0].message
        op = message.op
        offsets = offsets_of([r.message.count for r in responses])
        with self._on_gpu(requests, lambda: [self._output_for(r, m.message, op)
                                             for m, r in zip(responses, requests, strict=True)]) as outputs:
            if len(responses) == 1 and wire == np.dtype(message.dtype):
                self._allreduce_alone(requests[0], outputs[0], op, message)
                return outputs
            buf = self.fusion_buffer.get(offsets[-1], wire)
            pack(buf, offsets, requests, op, lambda array, piece: self._cast(array, piece, message.prescale))
            self.family.allreduce(buf, op)
            for index, output in enumerate(outputs):
                self._scale_result(buf[offsets[index]:offsets[index + 1]], output.reshape(-1), op, message.postscale)
        return outputs

    def _allreduce_alone(self, request, output, op, message):
        """One tensor, no compression: reduced straight into its output, read in place when unscaled."""
        flat, source = output.reshape(-1), None
        if request is not None and request.input is not output:
            source = self._contribution(request.input, flat, message.prescale)
        elif request is not None:  # in place
            self._cast(flat, flat, message.prescale)
        self.family.allreduce(flat, op, source)
        self._scale_result(flat, flat, op, message.postscale)

    def allgather(self, response, request):
        message = response.message
        row_offsets = offsets_of([m.shape[0] for m in response.messages])
        row_size = math.prod(message.shape[1:])
        with self._on_gpu([request], lambda: self.cupy.empty((row_offsets[-1],) + message.shape[1:],
                                                             message.dtype)) as result:
            result[row_offsets[self.rank]:row_offsets[self.rank + 1]] = request.input
            self.family.allgather(result.reshape(-1), [o * row_size for o in row_offsets])
        return result

    def broadcast(self, response, request):
        """Into the request's output, which collectives.py made C-contiguous (a copy on the root)."""
        with self._on_gpu([request]):
            self.family.broadcast(request.output.reshape(-1), response.message.root)
        return request.output

    def reducescatter(self, response, request):
        message = response.message
        op = message.op
        rows = even_counts(message.shape[0], self.size)
        row_size = math.prod(message.shape[1:])
        with self._on_gpu([request], lambda: self.cupy.empty((rows[self.rank],) + message.shape[1:],
                                                             message.dtype)) as result:
            work = self.cupy.empty(math.prod(message.shape), message.dtype)
            source = self._contribution(request.input, work, message.prescale)
            mine = self.family.reducescatter(work, offsets_of([r * row_size for r in rows]), op, source)
            self._scale_result(mine, result.reshape(-1), op, message.postscale)
        return result

    def _output_for(self, request, message, op):
        if request is None:  # a joined rank takes part with the op's identity
            return self.cupy.full(message.shape, reduction.identity(op, message.dtype), dtype=message.dtype)
        return request.output if request.output is not None else self.cupy.empty(message.shape, message.dtype)

    def _contribution(self, array, target, factor):
        """Where the family reads this rank's contribution (`array`, not `target`'s memory): `array`
        itself, flat, when unscaled and contiguous; else None, after casting it, scaled, into `target`."""
        if factor == 1.0 and array.flags.c_contiguous:
            return array.reshape(-1)
        self._cast(array.reshape(-1), target, factor)
        return None

    def _cast(self, source, target, factor):
        """target = source * factor in target's dtype: one kernel (a plain copy when unscaled)."""
        if factor != 1.0:
            self._scaled_cast(source, factor, target)
        elif source is not target:
            target[...] = source

    def _scale_result(self, reduced, output, op, postscale):
        """output = the op's result from the reduced values: for floats the cast back, the average
        and the postscale are one kernel; integers as on the host (truncated toward zero)."""
        if reduction.floating(output.dtype):
            self._cast(reduced, output, postscale / self.size if op == ReduceOp.AVERAGE else postscale)
        else:
            if reduced is not output:
                output[...] = reduced
            reduction.scale_result(output, op, self.size, postscale)
