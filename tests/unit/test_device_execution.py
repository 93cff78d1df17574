"""The device executor's logic (fusion buffer, casts, scaling, joined ranks, each collective)
on 1 to 3 thread ranks, with numpy standing in for CuPy and the staging transport over the
thread harness. The same code on a GPU is tested by tests/jobs/gpu/test_gpu.py where there is one."""

import numpy as np
import pytest
from device_standins import HostStandIn, LoggedRing, NumpyAsCupy, no_device
from threads import data, run_ranks

from ringreduce.algorithms.device import Staged
from ringreduce.engine.agreement import Message
from ringreduce.engine.negotiation import Response
from ringreduce.engine.requests import Handle, Request
from ringreduce.execution.device import DeviceExecutor
from ringreduce.machine.layout import even_counts, offsets_of
from ringreduce.ops import ReduceOp


def executor(transport):
    staged = Staged(HostStandIn([]), LoggedRing(transport, []), transport.rank, chunk_bytes=16)
    return DeviceExecutor(NumpyAsCupy, lambda: staged, transport.rank, transport.size, device_of=no_device)


def request(name, kind, array, output=None, **fields):
    message = Message(name=name, kind=kind, dtype=array.dtype.name, shape=array.shape, device="cuda", **fields)
    return Request(message, Handle(name), input=array, output=output)


def response(requests, size):
    """What the negotiation hands every rank: the same messages (None for a joined rank)."""
    mine = next(r for r in requests if r is not None).message
    return Response(mine.name, tuple(mine for _ in range(size)))


@pytest.mark.parametrize("size", [1, 2, 3])
def test_a_fused_group_with_fp16_average_and_scaling(size):
    """Small whole numbers, so every fp16 value and sum is exact and the result can be too."""
    lengths = [1, 0, 7, 50]
    fields = dict(op=int(ReduceOp.AVERAGE), prescale=0.5, postscale=2.0, compression="fp16")

    def work(transport):
        requests = [request(f"t{i}", "allreduce", data(transport.rank + 10 * i, n, np.float32), **fields)
                    for i, n in enumerate(lengths)]
        responses = [response([r], transport.size) for r in requests]
        return executor(transport).allreduce(responses, requests, np.dtype(np.float16))

    for outputs in run_ranks(size, work):
        for i, n in enumerate(lengths):
            summed = np.sum([data(r + 10 * i, n, np.float32) * 0.5 for r in range(size)], axis=0)
            np.testing.assert_array_equal(outputs[i], (summed.astype(np.float64) * (2.0 / size)).astype(np.float32))
            assert outputs[i].dtype == np.float32 and outputs[i].shape == (n,)


@pytest.mark.parametrize("size", [2, 3])
def test_a_joined_rank_contributes_the_identity(size):
    def work(transport):
        joined = transport.rank == size - 1
        group = [None if joined else request(f"t{i}", "allreduce", data(transport.rank + i, 9), op=int(ReduceOp.SUM))
                 for i in range(2)]
        template = [request(f"t{i}", "allreduce", data(0, 9), op=int(ReduceOp.SUM)) for i in range(2)]
        responses = [response([t], transport.size) for t in template]
        return executor(transport).allreduce(responses, group, np.dtype(np.int64))

    for outputs in run_ranks(size, work):
        for i in range(2):
            np.testing.assert_array_equal(outputs[i], np.sum([data(r + i, 9) for r in range(size - 1)], axis=0))


@pytest.mark.parametrize("size", [1, 2, 3])
def test_one_tensor_in_place_and_out_of_place(size):
    def work(transport):
        run = executor(transport)
        buf = data(transport.rank, 11)
        in_place = request("a", "allreduce", buf, output=buf, op=int(ReduceOp.AVERAGE))
        (averaged,) = run.allreduce([response([in_place], size)], [in_place], np.dtype(np.int64))
        assert averaged is buf
        scaled = request("b", "allreduce", data(transport.rank, 11), op=int(ReduceOp.SUM), prescale=3.0)
        (tripled,) = run.allreduce([response([scaled], size)], [scaled], np.dtype(np.int64))
        return averaged, tripled

    total = np.sum([data(r, 11) for r in range(size)], axis=0)
    for averaged, tripled in run_ranks(size, work):
        np.testing.assert_array_equal(averaged, np.sign(total) * (np.abs(total) // size))  # truncated
        np.testing.assert_array_equal(tripled, 3 * total)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_allgather_broadcast_and_reducescatter(size):
    def work(transport):
        run, rank = executor(transport), transport.rank
        mine = data(rank, 2 * (rank + 1)).reshape(rank + 1, 2)
        gather = request("g", "allgather", mine)
        shapes = tuple(Message(name="g", kind="allgather", dtype="int64", shape=(r + 1, 2), device="cuda")
                       for r in range(size))
        gathered = run.allgather(Response("g", shapes), gather)
        target = data(rank, 6)
        cast = request("b", "broadcast", target, output=target, root=size - 1)
        broadcast = run.broadcast(response([cast], size), cast)
        rows = data(rank, 15).reshape(5, 3)
        scatter = request("s", "reducescatter", rows, op=int(ReduceOp.SUM), postscale=2.0)
        scattered = run.reducescatter(response([scatter], size), scatter)  # read in place
        tripled = request("t", "reducescatter", rows.T.copy().T, op=int(ReduceOp.SUM), prescale=3.0)
        scaled = run.reducescatter(response([tripled], size), tripled)  # cast, scaled, into the work buffer
        return gathered, broadcast, scattered, scaled

    total = np.sum([data(r, 15).reshape(5, 3) for r in range(size)], axis=0)
    first = offsets_of(even_counts(5, size))
    for rank, (gathered, broadcast, scattered, scaled) in enumerate(run_ranks(size, work)):
        np.testing.assert_array_equal(gathered, np.concatenate([data(r, 2 * (r + 1)).reshape(r + 1, 2)
                                                                for r in range(size)]))
        np.testing.assert_array_equal(broadcast, data(size - 1, 6))
        np.testing.assert_array_equal(scattered, 2 * total[first[rank]:first[rank + 1]])
        np.testing.assert_array_equal(scaled, 3 * total[first[rank]:first[rank + 1]])
