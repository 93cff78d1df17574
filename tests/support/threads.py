"""Ranks as threads, for the unit tests of the algorithms: an in-memory transport of queues, a
shared segment of plain memory, and a runner that gives each rank's result back."""

import itertools
import queue
import threading

import numpy as np


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


class ThreadSegment:
    """The interface of ringreduce.shared_memory.Segment for threads: two data areas shared by
    every rank of the host, used in turn, and a threading.Barrier."""

    def __init__(self, rank, host):
        self.rank, self.size = rank, host["size"]
        self.area_bytes = host["areas"].shape[1]
        self.host = host
        self.uses = 0

    def area(self, dtype, count):
        area = self.host["areas"][self.uses % 2]
        self.uses += 1
        return area[:count * np.dtype(dtype).itemsize].view(dtype)

    def barrier(self):
        self.host["barrier"].wait(timeout=10)


def shared_host(size, piece_bytes):
    return {"size": size, "areas": np.zeros((2, size * piece_bytes), np.uint8), "barrier": threading.Barrier(size)}


def run_ranks(size, work, make=None):
    """Run work(transport) on `size` threads; return each rank's result. `make(rank, boxes)`
    builds what a rank's work gets instead of a QueueTransport over every rank."""
    boxes = {pair: queue.Queue() for pair in itertools.product(range(size), repeat=2)}
    results, errors = [None] * size, []

    def one(rank):
        try:
            results[rank] = work(make(rank, boxes) if make else QueueTransport(rank, size, boxes))
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results


def data(rank, length, dtype=np.int64):
    return np.random.default_rng([rank, length]).integers(-50, 50, size=length).astype(dtype)
