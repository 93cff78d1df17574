"""Collectives on process sets (two given to init, one added later, a one-rank set), in different
orders on different ranks, and each misuse; saves what this rank got and each error's text.
Usage: process_sets.py OUT_DIR"""

import json
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import ringreduce as rr  # noqa: E402

import cases  # noqa: E402

at_init, added = cases.process_set_layout(MPI.COMM_WORLD.size)
sets = {"global": rr.global_process_set} | {key: rr.ProcessSet(ranks) for key, ranks in at_init.items()}
rr.init(process_sets=[sets[key] for key in at_init])
rank, size = rr.rank(), rr.size()
sets |= {key: rr.add_process_set(ranks) for key, ranks in added.items()}
evens, tail = sets["evens"], sets.get("tail")
out, errors = {}, {}
info = {key: dict(id=s.process_set_id, ranks=s.ranks, size=s.size(), included=s.included(),
                  rank=s.rank() if s.included() else None) for key, s in sets.items()}


def record_error(key, call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the test checks the type and the text
        errors[key] = [type(error).__name__, str(error)]
    else:
        errors[key] = None


# Every collective on every set this rank is in; the sets in a different order on odd ranks, and
# each call's handle kept until all are submitted, so that the sets' work is in flight together.
mine = [key for key, s in sets.items() if s.included()]
handles = {}
for key in mine if rank % 2 == 0 else reversed(mine):
    s = sets[key]
    handles[f"{key}-sum"] = rr.allreduce_async(cases.values(rank, "float64", 1003), op=rr.Sum, process_set=s)
    handles[f"{key}-average"] = rr.allreduce_async(cases.values(rank, "float32", 17), process_set=s)
    handles[f"{key}-max"] = rr.allreduce_async(cases.values(rank, "int32", 40), op=rr.Max, name=f"{key}.max",
                                               process_set=s)
    handles[f"{key}-allgather"] = rr.allgather_async(cases.values(rank, "int64", 2 * (rank + 1)).reshape(-1, 2),
                                                     process_set=s)
    handles[f"{key}-broadcast"] = rr.broadcast_async(cases.values(rank, "float64", 31), root_rank=s.ranks[-1],
                                                     process_set=s)
    handles[f"{key}-reducescatter"] = rr.reducescatter_async(
        cases.values(rank, "float32", 3 * (2 * s.size() + 1)).reshape(-1, 3), op=rr.Sum, process_set=s)
for key, handle in handles.items():
    out[key] = rr.synchronize(handle)
for key in mine:
    s = sets[key]
    out[f"{key}-alltoall"] = rr.alltoall(cases.values(rank, "int32", 2 * s.size()).reshape(s.size(), 2),
                                         process_set=s)
    out[f"{key}-grouped"] = np.concatenate(rr.grouped_allreduce(
        [cases.values(rank, "float64", 5), cases.values(rank, "float64", 7)], op=rr.Sum, process_set=s))
    rr.barrier(process_set=s)
    info[key]["object"] = rr.broadcast_object({"from": rank}, root_rank=s.ranks[0], process_set=s)
    info[key]["objects"] = rr.allgather_object(rank * 10, process_set=s)

outsider = next((s for s in sets.values() if not s.included()), None)
if outsider is not None:
    record_error("not-a-member", lambda: rr.allreduce(np.ones(3), process_set=outsider))
if evens.included():
    record_error("root-outside", lambda: rr.broadcast(np.ones(2), root_rank=1, process_set=evens))
record_error("never-added", lambda: rr.allreduce(np.ones(3), process_set=rr.ProcessSet([0])))
record_error("disagree", lambda: rr.add_process_set([0] if rank == 0 else [size - 1]))
record_error("duplicate", lambda: rr.add_process_set([1, 0]))
record_error("outside-the-job", lambda: rr.add_process_set([0, size]))
# Rank 0 adds while the others remove: refused on every rank before anything changes.
record_error("changes-differ", lambda: rr.add_process_set([0]) if rank == 0 else rr.remove_process_set(evens))

if tail is not None:  # A set with a request in flight on one rank cannot be removed, on any rank.
    late = (rr.allreduce_async(np.full(4, rank, np.float64), op=rr.Sum, name="late", process_set=tail)
            if rank == 1 else None)
    record_error("remove-busy", lambda: rr.remove_process_set(tail))
    if tail.included():
        out["tail-late"] = rr.synchronize(late if late is not None else rr.allreduce_async(
            np.full(4, rank, np.float64), op=rr.Sum, name="late", process_set=tail))
    if tail.included():  # join within the set: rank 1 has no more data, the others' allreduce goes on
        if rank != 1:
            out["tail-joined"] = rr.allreduce(np.full(2, rank, np.float64), op=rr.Sum, name="joined",
                                              process_set=tail)
        info["tail-join"] = rr.join(process_set=tail)
    info["removed-tail"] = rr.remove_process_set(tail)
    info["removed-tail-again"] = rr.remove_process_set(tail)
    record_error("use-removed", lambda: rr.allreduce(np.ones(3), process_set=tail))
info["removed-global"] = rr.remove_process_set(rr.global_process_set)
out["after-global"] = rr.allreduce(cases.values(rank, "float64", 9), op=rr.Sum)  # the rest keeps working
if evens.included():
    out["after-evens"] = rr.allreduce(cases.values(rank, "float64", 9), op=rr.Sum, process_set=evens)

out_dir = sys.argv[1]
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **out)
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"info": info, "errors": errors}, f)
rr.shutdown()
