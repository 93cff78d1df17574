"""Point-to-point transfers at 3 ranks, against what the test computes: a ring of isend/irecv, recv
from any rank, a set's own transfers beside collectives pending on the same ranks, many tags in
flight at once, and each misuse. Usage: point_to_point.py OUT_DIR"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import ringreduce as rr  # noqa: E402

import cases  # noqa: E402

rr.init()
rank, size = rr.rank(), rr.size()
out, errors = {}, {}


def record_error(key, call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the test checks the type and the text
        errors[key] = [type(error).__name__, str(error)]


# A ring, every rank sending and receiving at once (no deadlock with the async forms).
right, left = (rank + 1) % size, (rank - 1) % size
received = np.empty(1001, np.float64)
sending = rr.isend(cases.values(rank, "float64", 1001), right)
out["ring-from"] = np.array(rr.irecv(received, left).wait())
sending.wait()
out["ring"] = received

# Ranks 0 and 1 send to each other at once, messages of different lengths, several in flight.
if rank < 2:
    other = 1 - rank
    works = [rr.isend(cases.values(rank, "float32", 10 + rank + 5 * i), other) for i in range(3)]
    for i in range(3):
        into = np.empty(10 + other + 5 * i, np.float32)
        rr.recv(into, other)
        out[f"both-ways-{i}"] = into
    for work in works:
        work.wait()

# Rank 0 receives from whichever rank sends, on tags 5 and 6 in flight together; strided into a view.
if rank == 0:
    for turn in range(2 * (size - 1)):
        tag = 5 + turn % 2
        buffer = np.zeros((4, 6), np.int32)
        sender = rr.recv(buffer[:, ::2], tag=tag)
        out[f"any-{sender}-{tag}"] = buffer[:, ::2].copy()
else:
    works = [rr.isend(cases.values(rank, "int32", 12, salt=t).reshape(4, 3), 0, tag=t) for t in (5, 6)]
    for work in works:
        work.wait()

# Within the set [1, 2]: a transfer while a collective of the whole job is pending on both.
pair = rr.add_process_set([1, 2])
pending = rr.allreduce_async(np.full(3, rank, np.float64), op=rr.Sum, name="pending")
if rank == 1:
    rr.send(np.arange(5, dtype=np.uint8), 2, process_set=pair, tag=1)
elif rank == 2:
    into = np.empty(5, np.uint8)
    out["pair-from"] = np.array(rr.recv(into, 1, process_set=pair, tag=1))
    out["pair"] = into
out["pending"] = rr.synchronize(pending)

# Misuse: a mismatch on both ends; bad peers, tags and dtypes, before anything is sent.
if rank == 0:
    record_error("mismatch", lambda: rr.send(np.zeros((2, 3), np.float32), 1, tag=9))
elif rank == 1:
    record_error("mismatch", lambda: rr.recv(np.zeros((3, 2), np.float64), 0, tag=9))
record_error("self", lambda: rr.send(np.zeros(2), rank))
record_error("outside", lambda: rr.send(np.zeros(2), size))
record_error("tag", lambda: rr.send(np.zeros(2), right, tag=-1))
record_error("dtype", lambda: rr.send(np.zeros(2, np.complex64), right))
record_error("readonly", lambda: rr.recv(np.frombuffer(b"12345678", np.uint8), right))
if rank == 0:
    record_error("not-in-set", lambda: rr.send(np.zeros(2), 1, process_set=pair))
out["after"] = rr.allreduce(np.ones(2), op=rr.Sum)

np.savez(os.path.join(sys.argv[1], f"rank{rank}.npz"), **out)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(errors, f)
