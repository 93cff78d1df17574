"""Plain calls in program order, one mode per run; each rank writes what it got to OUT/rankR.json
(and OUT/rankR.npz for arrays).
Usage: plain_calls.py MODE OUT

results: plain allreduces of every dtype and op, small (with their data in program order), large
  (run by the caller after the meeting) or compressed (checked in program order, run by the
  engine), on the whole job and on a set of the first and last rank (of the last alone at 2
  ranks), scaled, in place, of a scalar; barriers; and the async form of the same call. A large
  reducescatter and broadcast. Small allgathers (rank r gives r rows) and broadcasts from every
  root, in place and not, small reducescatters (rows that do not divide evenly), and an allgather
  with one rank's rows too many to carry; an allreduce made at call sites of different lengths;
  repeats of an allgather, broadcast, broadcast_ and reducescatter with new data (and a new root).
join: rank r makes 2 + r steps of a small and a large plain allreduce, then joins.
rejoin: 300 rounds of: rank r makes (round + r) % size plain allreduces, joins, and at once makes
  one more (the ranks see the join end at different moments; the call must pair with the others').
elsewhere: rank 0 waits in a plain allreduce while rank 1 waits in an async allgather that rank 0
  never submits; rank 1 gets the DeadlockError, then makes the plain call, which rank 0 then ends.
left: rank 1 shuts down while rank 0 waits in a plain allreduce.
long: rank 1's call has a description longer than the others have room for.
stall: rank 1 comes 3 s late to a plain allreduce (RINGREDUCE_STALL_SHUTDOWN_TIME=1): rank 0 gives
  up, and its plain calls fail from then on; rank 1's late call pairs with rank 0's and its next one
  finds rank 0 gone.
"""

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import ringreduce as rr  # noqa: E402
from ringreduce import runtime  # noqa: E402

import cases  # noqa: E402

mode, out = sys.argv[1], sys.argv[2]
rr.init()
rank, size = rr.rank(), rr.size()
report = {}
arrays = {}


def error_text(error):
    return f"{type(error).__name__}: {error}"


def ran_in_order():
    return rr.engine_stats()["in_program_order"]


if mode == "results":
    ends = rr.add_process_set(cases.ends(size))
    for where, process_set in (("global", None), ("ends", ends)):
        if process_set is not None and not process_set.included():
            continue
        before = ran_in_order() if process_set is None else None
        for dtype in cases.DTYPES:
            for op in cases.BOOL_OPS if dtype == "bool" else cases.OPS:
                arrays[f"{where}-{dtype}-{op}"] = rr.allreduce(cases.values(rank, dtype, 33), op=getattr(rr, op),
                                                               process_set=process_set)
        x = cases.normal(rank, "float32", 257)
        arrays[f"{where}-scaled"] = rr.allreduce(x, op=rr.Average, prescale_factor=0.5, postscale_factor=3.0,
                                                 process_set=process_set)
        arrays[f"{where}-scaled-async"] = rr.synchronize(rr.allreduce_async(
            x, op=rr.Average, prescale_factor=0.5, postscale_factor=3.0, process_set=process_set))
        in_place = cases.values(rank, "int64", 9).reshape(3, 3)
        returned = rr.allreduce_(in_place, op=rr.Sum, process_set=process_set)
        report[f"{where}-in-place-same-array"] = returned is in_place
        arrays[f"{where}-in-place"] = in_place
        arrays[f"{where}-scalar"] = rr.allreduce(np.float64(rank + 1), op=rr.Sum, process_set=process_set)
        rr.barrier(process_set=process_set)
        if before is not None:
            report["small-ran-in-order"] = ran_in_order() - before
            before = ran_in_order()
            arrays["large"] = rr.allreduce(cases.values(rank, "float32", 100_000), op=rr.Sum)
            arrays["large-scattered"] = rr.reducescatter(cases.values(rank, "float64", 30_001).reshape(-1, 1),
                                                         op=rr.Sum)
            arrays["large-broadcast"] = rr.broadcast(cases.values(rank, "int16", 70_000), root_rank=size - 1)
            arrays["compressed"] = rr.allreduce(cases.values(rank, "float32", 10), op=rr.Sum,
                                                compression=rr.Compression.fp16)
            report["large-ran-in-order"] = ran_in_order() - before
        before = ran_in_order()
        members = process_set.ranks if process_set is not None else list(range(size))
        arrays[f"{where}-gathered"] = rr.allgather(cases.values(rank, "int32", 3 * rank).reshape(rank, 3),
                                                   process_set=process_set)
        for root in members:
            arrays[f"{where}-broadcast-{root}"] = rr.broadcast(cases.values(rank, "float64", 5), root_rank=root,
                                                               process_set=process_set)
            in_place = cases.values(rank, "uint8", 6).reshape(2, 3)
            report[f"{where}-broadcast_-{root}-same-array"] = rr.broadcast_(
                in_place, root_rank=root, process_set=process_set) is in_place
            arrays[f"{where}-broadcast_-{root}"] = in_place
        # A peer's data lies after its description, which here is longer or shorter than this rank's.
        site = compile("summed = rr.allreduce(np.full(4, rank + 1.0), op=rr.Sum, process_set=process_set)",
                       "s" * (1 + 37 * rank) + ".py", "exec")
        exec(site)
        arrays[f"{where}-other-sites"] = summed  # noqa: F821 (the exec's)
        arrays[f"scattered-{where}"] = rr.reducescatter(cases.values(rank, "int64", 14).reshape(7, 2), op=rr.Sum,
                                                        process_set=process_set)
        arrays[f"scattered-average-{where}"] = rr.reducescatter(
            cases.normal(rank, "float32", 15).reshape(5, 3), op=rr.Average, prescale_factor=0.5,
            postscale_factor=3.0, process_set=process_set)
        report[f"{where}-gathered-ran-in-order"] = ran_in_order() - before
        # The last rank's rows are too many to carry: every rank sees it and the engine runs the call.
        rows = 20_000 if rank == members[-1] else 1
        arrays[f"{where}-gathered-large"] = rr.allgather(np.full((rows, 2), rank, np.float32), process_set=process_set)
        report[f"{where}-gathered-large-ran-in-order"] = ran_in_order() - before
        # Repeats of each kind with the same arguments and new data: from the second on, the
        # checked Message of the first meets the others at once (its root changes on the third).
        for repeat, root in enumerate([members[0], members[0], members[-1], members[0]]):
            arrays[f"repeat-{where}-{repeat}-gathered"] = rr.allgather(
                cases.values(rank, "int32", 2 * (rank + 1)).reshape(rank + 1, 2) + repeat, process_set=process_set)
            arrays[f"repeat-{where}-{repeat}-broadcast"] = rr.broadcast(
                cases.values(rank, "float64", 5) + repeat, root_rank=root, process_set=process_set)
            in_place = cases.values(rank, "uint8", 6) + np.uint8(repeat)
            rr.broadcast_(in_place, root_rank=root, process_set=process_set)
            arrays[f"repeat-{where}-{repeat}-broadcast_"] = in_place
            arrays[f"repeat-{where}-{repeat}-scattered"] = rr.reducescatter(
                cases.normal(rank, "float32", 15).reshape(5, 3) + repeat, op=rr.Average, prescale_factor=0.5,
                postscale_factor=3.0, process_set=process_set)
        checked = runtime.active().domain(process_set).checked
        report[f"{where}-checked-kinds"] = sorted({key[4] for key in checked})

elif mode == "join":
    for step in range(2 + rank):
        arrays[f"small-{step}"] = rr.allreduce(np.full(4, step + 1.0), op=rr.Sum)
        arrays[f"large-{step}"] = rr.allreduce(np.full(50_000, step + 1.0), op=rr.Average)
    report["last"] = rr.join()
    report["after"] = rr.allreduce(np.ones(2), op=rr.Sum).tolist()

elif mode == "rejoin":
    report["after"] = []
    for round_ in range(300):
        for _ in range((round_ + rank) % size):
            rr.allreduce(np.ones(3), op=rr.Sum)
        rr.join()
        report["after"].append(rr.allreduce(np.ones(1), op=rr.Sum).item())

elif mode == "elsewhere":
    if rank == 0:
        report["plain"] = rr.allreduce(np.full(2, 1.0), op=rr.Sum, name="plain").tolist()
    else:
        try:
            rr.synchronize(rr.allgather_async(np.ones(2), name="only-on-1"))
        except rr.DeadlockError as error:
            report["error"] = error_text(error)
        report["plain"] = rr.allreduce(np.full(2, 2.0), op=rr.Sum, name="plain").tolist()

elif mode == "left":
    if rank == 1:
        rr.shutdown()
    else:
        try:
            rr.allreduce(np.ones(2), name="lonely")
        except rr.PeerExitedError as error:
            report["error"] = error_text(error)

elif mode == "stall":
    if rank == 1:
        time.sleep(3)
    for call in ("late", "next"):
        try:
            report[call] = rr.allreduce(np.full(2, rank + 1.0), op=rr.Sum, name=call).tolist()
        except rr.RingReduceError as error:
            report[call] = error_text(error)

elif mode == "long":
    try:
        rr.allreduce(np.ones(2), name="x" * (50_000 if rank == 1 else 1))
    except rr.MismatchError as error:
        report["error"] = error_text(error)
    report["after"] = rr.allreduce(np.ones(2), op=rr.Sum).tolist()

else:
    raise SystemExit(f"unknown mode {mode}")

if arrays:
    np.savez(os.path.join(out, f"rank{rank}.npz"), **arrays)
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(report, f)
