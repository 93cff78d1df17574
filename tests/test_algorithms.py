"""The algorithms as pure logic, at 1 to 8 ranks, over an in-memory transport of threads and
queues: many more rank counts and lengths than real processes on two cores can afford."""

import itertools
import queue
import threading

import numpy as np
import pytest

from ringreduce.algorithms import pairwise, ring, tree


class _Sent:
    def complete(self):
        pass


class _Receive:
    def __init__(self, box, buf):
        self.box, self.buf = box, buf

    def complete(self):
        data = self.box.get(timeout=10)
        assert data.nbytes == self.buf.nbytes, "sender and receiver disagree on a message's size"
        self.buf.view(np.uint8)[:] = data


class QueueTransport:
    """The transport interface of ringreduce.transports, with one FIFO per ordered pair of ranks."""

    def __init__(self, rank, size, boxes):
        self.rank, self.size, self.boxes = rank, size, boxes

    def isend(self, buf, dest):
        self.boxes[self.rank, dest].put(buf.view(np.uint8).copy())
        return _Sent()

    def irecv(self, buf, source):
        return _Receive(self.boxes[source, self.rank], buf)

    def wait(self, requests):
        for request in requests:
            request.complete()

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        self.wait([self.irecv(recvbuf, source), self.isend(sendbuf, dest)])


def run_ranks(size, work):
    """Run work(transport) on `size` threads; return each rank's result."""
    boxes = {pair: queue.Queue() for pair in itertools.product(range(size), repeat=2)}
    results, errors = [None] * size, []

    def one(rank):
        try:
            results[rank] = work(QueueTransport(rank, size, boxes))
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results


SIZES = range(1, 9)


def data(rank, length, dtype=np.int64):
    return np.random.default_rng([rank, length]).integers(-50, 50, size=length).astype(dtype)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_ring_allreduce(size, chunk):
    for length in sorted({0, 1, size - 1, size, size + 1, 97}):
        def work(t, length=length):
            buf = data(t.rank, length)
            ring.allreduce(t, buf, np.add, np.empty(length // size + 1, np.int64), chunk)
            return buf

        expected = np.sum([data(r, length) for r in range(size)], axis=0, dtype=np.int64)
        for got in run_ranks(size, work):
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("size", SIZES)
def test_ring_reduce_scatter_with_uneven_and_empty_segments(size):
    counts = [(3 * r) % 4 for r in range(size)]  # includes empty segments
    offsets = ring.offsets_of(counts)

    def work(t):
        buf = data(t.rank, offsets[-1])
        ring.reduce_scatter(t, buf, offsets, np.maximum, np.empty(4, np.int64), 2)
        return buf[offsets[t.rank]:offsets[t.rank + 1]]

    expected = np.max([data(r, offsets[-1]) for r in range(size)], axis=0)
    for rank, got in enumerate(run_ranks(size, work)):
        np.testing.assert_array_equal(got, expected[offsets[rank]:offsets[rank + 1]])


@pytest.mark.parametrize("size", SIZES)
def test_ring_allgather_ragged(size):
    counts = [r % 3 for r in range(size)]
    offsets = ring.offsets_of(counts)

    def work(t):
        buf = np.zeros(offsets[-1], np.int64)
        buf[offsets[t.rank]:offsets[t.rank + 1]] = data(t.rank, counts[t.rank])
        ring.allgather(t, buf, offsets)
        return buf

    expected = np.concatenate([data(r, counts[r]) for r in range(size)])
    for got in run_ranks(size, work):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("chunk", [1, 5, 1 << 20])
def test_tree_broadcast_from_every_root(size, chunk):
    for root in range(size):
        def work(t, root=root):
            buf = data(t.rank, 23, np.float32)
            tree.broadcast(t, buf, root, chunk)
            return buf

        for got in run_ranks(size, work):
            np.testing.assert_array_equal(got, data(root, 23, np.float32))


@pytest.mark.parametrize("size", SIZES)
def test_pairwise_alltoallv(size):
    splits = [[(s + 2 * d) % 3 for d in range(size)] for s in range(size)]

    def work(t):
        send = data(t.rank, sum(splits[t.rank]))
        received = [splits[s][t.rank] for s in range(size)]
        recv = np.empty(sum(received), np.int64)
        pairwise.alltoallv(t, send, ring.offsets_of(splits[t.rank]), recv, ring.offsets_of(received))
        return recv

    for rank, got in enumerate(run_ranks(size, work)):
        blocks = [data(s, sum(splits[s]))[sum(splits[s][:rank]):sum(splits[s][:rank + 1])] for s in range(size)]
        np.testing.assert_array_equal(got, np.concatenate(blocks))


def test_even_counts():
    assert ring.even_counts(7, 3) == [3, 2, 2]
    assert ring.even_counts(2, 4) == [1, 1, 0, 0]
    assert ring.offsets_of([3, 0, 2]) == [0, 3, 3, 5]
