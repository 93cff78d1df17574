"""Exercises the background engine. Usage: engine.py MODE [OUT_DIR]; see each mode below."""

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import ringreduce as rr  # noqa: E402

import cases  # noqa: E402

rr.init()
rank, size = rr.rank(), rr.size()
mode = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else None


def report(**values):
    print("REPORT " + json.dumps(values), flush=True)


def delta(before):
    after = rr.engine_stats()
    return {key: after.get(key, 0) - before.get(key, 0) for key in after}


if mode == "stress":
    # Many tensors, submitted in a different order on each rank with different pauses; every
    # other one in place, so fused groups mix results written into the inputs and new ones.
    specs = list(enumerate(cases.stress_specs()))
    rng = np.random.default_rng(100 + rank)
    rng.shuffle(specs)
    handles = {}
    for position, (index, (name, dtype, shape, op)) in enumerate(specs):
        array = cases.stress_input(rank, index, dtype, shape)
        submit = rr.allreduce_async_ if index % 2 else rr.allreduce_async
        handles[name] = submit(array, op=getattr(rr, op), name=name)
        if position % 10 == 0:
            time.sleep(rng.random() * 0.01)
    np.savez(os.path.join(out, f"rank{rank}.npz"), **{n: rr.synchronize(h) for n, h in handles.items()})

elif mode == "fusion":
    # 100 small tensors submitted together, then the same one at a time.
    before = rr.engine_stats()
    handles = [rr.allreduce_async(np.full(10, rank + i, dtype=np.float32), op=rr.Sum, name=f"small.{i}")
               for i in range(100)]
    results = [rr.synchronize(h) for h in handles]
    together = delta(before)
    correct = all(np.array_equal(r, np.full(10, sum(k + i for k in range(size)), np.float32))
                  for i, r in enumerate(results))
    grouped = rr.grouped_allreduce([np.full(3, rank, np.int64)] * 20, op=rr.Sum)
    correct = correct and all(np.array_equal(g, np.full(3, sum(range(size)))) for g in grouped)
    report(together=together, correct=correct)

elif mode == "aliased":
    # One array submitted in place under two names at once, and read out of place by a third:
    # every request reads the array as it was, as when each is copied into a fusion buffer first.
    array = np.arange(50_000, dtype=np.float32) * (rank + 1)
    original = array.copy()
    handles = [rr.allreduce_async_(array, op=rr.Sum, name="twice.a"),
               rr.allreduce_async_(array, op=rr.Sum, name="twice.b"),
               rr.allreduce_async(array, op=rr.Sum, name="read")]
    results = [rr.synchronize(h) for h in handles]
    expected = original * sum(range(1, size + 1)) / (rank + 1)
    report(correct=[bool(np.array_equal(r, expected)) for r in results])

elif mode == "cache":
    # A training loop's steady state: the same named tensors every iteration.
    from ringreduce import collectives
    checked, check = [], collectives._reduction
    collectives._reduction = lambda *args, **kwargs: checked.append(1) or check(*args, **kwargs)
    before = rr.engine_stats()
    for step in range(20):
        handles = [rr.allreduce_async(np.full(5, step + rank, np.float64), name=f"grad.{i}") for i in range(10)]
        in_place = np.full(3, step + rank, np.float32)
        handles.append(rr.allreduce_async_(in_place, op=rr.Sum, name="grad.in_place"))
        assert all(np.array_equal(rr.synchronize(h), np.full(5, step + 0.5, np.float64)) for h in handles[:-1])
        assert rr.synchronize(handles[-1]) is in_place and np.array_equal(in_place, np.full(3, 2 * step + 1))
    stats = delta(before)
    checks = len(checked)  # the arguments of each name checked once, then its Message reused
    collectives._reduction = check
    # Arguments the checks would refuse, under a name whose Message was kept: refused all the same.
    refused = []
    for bad in (lambda: rr.allreduce_async(np.full(5, True), name="grad.0"),  # Average of bools
                lambda: rr.allreduce_async_(np.full(3, 1, np.float32)[::-1], op=rr.Sum, name="grad.in_place")):
        try:
            rr.synchronize(bad())
        except (ValueError, TypeError) as error:
            refused.append(f"{type(error).__name__}: {error}")
    # Plain grouped calls go through the engine (engine/plain_calls.py runs the single ones).
    large = 20_000
    before = rr.engine_stats()
    for step in range(50):  # one cached name at a time: the steady state needs no gather
        (total,) = rr.grouped_allreduce([np.full(large, step + rank, np.int64)], op=rr.Sum, name="steady")
        assert np.array_equal(total, np.full(large, size * step + sum(range(size))))
    steady = delta(before)
    before = rr.engine_stats()
    for step in range(50):  # unnamed plain calls, as in user code: they repeat their name too
        (total,) = rr.grouped_allreduce([np.full(large, step + rank, np.float64)], op=rr.Sum)
        assert (total == size * step + sum(range(size))).all()
    unnamed_plain = delta(before)
    before = rr.engine_stats()
    for step in range(10):  # unnamed async calls are counted: a new name each time
        rr.synchronize(rr.allreduce_async(np.float64(step), op=rr.Sum))
    unnamed_async = delta(before)
    before = rr.engine_stats()
    for step in range(50):  # small plain calls run in program order, without the engine
        assert rr.allreduce(np.float64(step + rank), op=rr.Sum) == size * step + sum(range(size))
    report(stats=stats, steady=steady, unnamed_plain=unnamed_plain, unnamed_async=unnamed_async,
           small_plain=delta(before), checks=checks, refused=refused)

elif mode == "compressed":  # engine.py compressed OUT fp16|bf16
    compression = getattr(rr.Compression, sys.argv[3])
    big = 70000.0  # beyond float16's largest value, 65504
    arrays = {
        "float32": cases.normal(rank, "float32", 1000),
        "float64": cases.normal(rank, "float64", 1000),
        "large": cases.normal(rank, "float32", 50_000),  # beyond MPI's own small allreduces
        "int32": cases.values(rank, "int32", 1000),
        "overflow": np.full(4, big, np.float32),
        "prescaled": np.full(4, big, np.float32),
    }
    results, wire = {}, {}
    for key, value in arrays.items():
        if key != "prescaled":
            before = rr.engine_stats()["bytes"]
            results[key] = rr.allreduce(value, op=rr.Sum, compression=compression, name=key)
            wire[key] = rr.engine_stats()["bytes"] - before
    results["prescaled"] = rr.allreduce(arrays["prescaled"], op=rr.Sum, compression=compression,
                                        prescale_factor=1.0 / 1024, postscale_factor=1024.0, name="prescaled")
    results["grouped"] = np.concatenate(rr.grouped_allreduce(
        [cases.normal(rank, "float32", 7), cases.normal(rank, "float32", 11)], op=rr.Average,
        compression=compression))
    np.savez(os.path.join(out, f"rank{rank}.npz"), **results)
    report(wire=wire)

elif mode == "join":
    # Uneven data: rank r has 3 + r batches, then joins.
    results = []
    for step in range(3 + rank):
        results.append(rr.allreduce(np.full(4, step + 1.0), op=rr.Sum, name=f"batch.{step}"))
    last = rr.join()
    np.save(os.path.join(out, f"rank{rank}.npy"), np.stack(results))
    report(last=last)

elif mode == "withhold":
    # Rank 1 never submits 'withheld'; the others wait for it.
    if rank != 1:
        rr.synchronize(rr.allreduce_async(np.ones(3), name="withheld"))
    else:
        time.sleep(60)

elif mode == "timeline":
    for step in range(3):
        rr.grouped_allreduce([np.ones(100, np.float32), np.ones(10, np.float32)], name=f"step{step}")
        rr.synchronize(rr.broadcast_async(np.ones(5), root_rank=0, name=f"bcast{step}"))
        rr.broadcast(np.ones(5), root_rank=0, name=f"plain-bcast{step}")  # in the meeting in program order

elif mode == "timeline-then-hang":
    for step in range(3):
        rr.allreduce(np.ones(100, np.float32), name=f"step{step}")
    print("steps done", flush=True)
    time.sleep(300)

elif mode == "straggler":
    for _ in range(20):
        if rank == size - 1:
            time.sleep(0.05)  # far beyond the scheduling noise of 3 ranks on 2 cores
        rr.allreduce(np.ones(100), name="grad")
    report(report=rr.straggler_report())

elif mode == "shutdown-pending":
    # Rank 0 shuts down with a request pending; rank 1 submits it (and another) only afterwards.
    if rank == 0:
        handle = rr.allreduce_async(np.ones(3), name="pending")
        rr.shutdown()
        try:
            rr.synchronize(handle)
        except rr.RingReduceError as error:
            report(error=f"{type(error).__name__}: {error}")
    else:
        time.sleep(1.0)
        for name in ("pending", "after"):
            try:
                rr.synchronize(rr.allreduce_async(np.ones(3), name=name))
            except rr.RingReduceError as error:
                report(error=f"{type(error).__name__}: {error}")

elif mode == "poll":
    handle = rr.allreduce_async(np.ones(3), name="polled")
    value = rr.synchronize(handle)
    report(done=rr.poll(handle), value=value.tolist())
elif mode == "deadlock":
    # Rank r waits in its own allreduce, which no other rank submits; then every rank goes on. (Plain
    # calls of different names would meet in program order, an error at once: test_errors.py.)
    started = time.monotonic()
    try:
        rr.synchronize(rr.allreduce_async(np.ones(3), name=f"only-on-{rank}"))
    except rr.DeadlockError as error:
        report(error=str(error), seconds=time.monotonic() - started)
    report(after=rr.allreduce(np.full(2, rank + 1.0), op=rr.Sum, name="after").tolist())

elif mode == "computing":
    # Rank 1 computes for longer than the deadlock time before it submits: no deadlock.
    if rank == 1:
        time.sleep(float(os.environ["RINGREDUCE_DEADLOCK_TIME"]) * 3)
    report(result=rr.allreduce(np.full(2, rank + 1.0), op=rr.Sum, name="late").tolist())
else:
    raise SystemExit(f"unknown mode {mode}")
