"""Each case makes rank 1 (or every rank) call a collective wrongly. With --catch every rank
prints the error it got and then proves the job still works; without, the error is uncaught.
Usage: mismatch.py [--catch] CASE..."""

import sys

import numpy as np

import ringreduce as rr

rr.init()
rank = rr.rank()
odd = rank == 1


def run(case):
    if case == "shape":
        rr.allreduce(np.zeros(4 if odd else 3, dtype=np.float32), name="grad")
    elif case == "sites":  # the same name called from two places: the error says which rank called where
        if odd:
            rr.allreduce(np.zeros(4), name="placed")
        else:
            rr.allreduce(np.zeros(3), name="placed")
    elif case == "dtype":
        rr.allreduce(np.zeros(3, dtype=np.float64 if odd else np.float32))
    elif case == "op":
        rr.allreduce(np.zeros(3), op=rr.Max if odd else rr.Sum)
    elif case == "root":
        rr.broadcast(np.zeros(3), root_rank=1 if odd else 0)
    elif case == "kind":
        (rr.broadcast(np.zeros(3), root_rank=0) if odd else rr.allreduce(np.zeros(3)))
    elif case == "scaling":
        rr.allreduce(np.zeros(3), prescale_factor=2.0 if odd else 1.0)
    elif case == "scaling-type":  # a factor no key can hold, on a named call: the checks still name it
        rr.synchronize(rr.allreduce_async(np.zeros(3), name="scaled", prescale_factor=[2.0] if odd else 1.0))
    elif case == "compression":
        rr.allreduce(np.zeros(3), compression=rr.Compression.fp16 if odd else rr.Compression.none)
    elif case == "length":  # a packet far longer than the others expect
        rr.allreduce(np.zeros(2000 if odd else 3, dtype=np.float32), name="grad")
    elif case == "name":
        rr.allreduce(np.zeros(3), name="odd" if odd else "even")
    elif case == "duplicate":
        first = rr.allreduce_async(np.ones(3), name="twice")
        second = rr.allreduce_async(np.ones(3), name="twice")
        rr.synchronize(first)
        rr.synchronize(second)
    elif case == "unsupported":
        rr.allreduce(np.zeros(3, dtype=np.complex64 if odd else np.float32))
    elif case == "allgather-trailing":
        rr.allgather(np.zeros((2, 4 if odd else 3)))
    elif case == "splits":
        rr.alltoall(np.zeros((4, 2)), splits=[5] * rr.size() if odd else [4] + [0] * (rr.size() - 1))
    elif case == "bool-sum":
        rr.allreduce(np.ones(3, dtype=bool), op=rr.Sum)
    elif case == "root-out-of-range":
        rr.broadcast(np.zeros(3), root_rank=rr.size())
    elif case == "set-shapes":  # within process set [1, 2]; rank 0 is not in it and calls nothing
        pair = rr.add_process_set([1, 2])
        try:
            if pair.included():
                rr.allreduce(np.zeros(4 if odd else 3), name="grad", process_set=pair)
        finally:
            rr.remove_process_set(pair)
    elif case == "before-init":
        rr.shutdown()
        rr.allreduce(np.zeros(3))
    else:
        raise SystemExit(f"unknown case {case}")


catch = sys.argv[1] == "--catch"
for case in sys.argv[2:] if catch else sys.argv[1:]:
    if not catch:
        run(case)
        continue
    try:
        run(case)
    except Exception as error:  # every rank must get here, for every case
        print(f"{case}: caught {type(error).__name__}: {error}", flush=True)
    else:
        print(f"{case}: no error", flush=True)
    if rr.is_initialized():
        print(f"{case}: afterwards sum = {rr.allreduce(np.ones(2), op=rr.Sum).tolist()}", flush=True)
