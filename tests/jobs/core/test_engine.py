"""The background engine through real rrun and MPI: out-of-order submission, fusion, the
cache, fp16 compression, join, stalls, the timeline, stragglers and shutdown."""

import json
import os
import re
import signal
import subprocess
import time

import ml_dtypes
import numpy as np
import pytest

import cases
from launch import rrun_command, run_job, site_in


def reports(job, rank):
    return [json.loads(line[len("REPORT "):]) for line in job.lines_of(rank) if line.startswith("REPORT ")]


# With pieces of the shared segment far smaller than the fused groups, results written where
# their arrays lie cross the arrays' boundaries in every piece.
@pytest.mark.parametrize("env", [{}, {"RINGREDUCE_SHM_PIECE_BYTES": "12345"}], ids=["default", "small-pieces"])
def test_three_hundred_tensors_in_a_different_order_on_every_rank(tmp_path, env):
    job = run_job(3, "core/engine.py", "stress", tmp_path, env=env)
    assert job.returncode == 0, job.stderr[-3000:]
    results = [np.load(tmp_path / f"rank{r}.npz") for r in range(3)]
    for index, (name, dtype, shape, op) in enumerate(cases.stress_specs()):
        expected = cases.reference_reduce([cases.stress_input(r, index, dtype, shape) for r in range(3)], op)
        for rank in range(3):
            got = results[rank][name]
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            np.testing.assert_array_equal(got, expected, err_msg=f"{name} on rank {rank}")


def test_an_array_read_by_several_requests_of_one_fused_group_is_read_as_it_was():
    """Submitted in place twice and out of place once: on the shared-memory path, in pieces
    smaller than the array, no request reads what another has already written."""
    job = run_job(2, "core/engine.py", "aliased", env={"RINGREDUCE_SHM_PIECE_BYTES": "12345"})
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(2):
        assert reports(job, rank) == [{"correct": [True, True, True]}]


@pytest.mark.parametrize("threshold, most_collectives", [(None, 3), ("0", 100)])
def test_small_tensors_submitted_together_are_fused(threshold, most_collectives):
    env = {} if threshold is None else {"RINGREDUCE_FUSION_THRESHOLD": threshold}
    job = run_job(2, "core/engine.py", "fusion", env=env)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(2):
        (got,) = reports(job, rank)
        assert got["correct"]
        assert got["together"]["tensors"] == 100
        assert got["together"]["bytes"] == 100 * 10 * 4
        if threshold is None:
            assert 1 <= got["together"]["collectives"] <= most_collectives
        else:
            assert got["together"]["collectives"] == 100


@pytest.mark.parametrize("capacity", [None, "0"])
def test_a_repeated_loop_runs_from_the_cache_named_or_unnamed(capacity):
    env = {} if capacity is None else {"RINGREDUCE_CACHE_CAPACITY": capacity}
    job = run_job(2, "core/engine.py", "cache", env=env)
    assert job.returncode == 0, job.stderr[-3000:]
    (got,) = reports(job, 0)
    stats = got["stats"]
    assert stats["tensors"] == 220
    assert got["checks"] == 11  # each name's arguments once; its later calls reuse the checked Message
    assert len(got["refused"]) == 2, got["refused"]
    assert "Average is not defined for bool" in got["refused"][0] and "C-contiguous" in got["refused"][1]
    steady = got["steady"]
    assert steady["tensors"] == 50
    if capacity is None:
        assert stats["announced"] == 2 * 11  # each rank announces each name once
        assert stats["cache_hits"] == 209  # every later iteration is bits only
        # One small allreduce per cycle, and the rows only when the ranks' states differ (the
        # first announcement, or a cycle that catches one rank before its call): rarely.
        assert steady["state_gathers"] <= 10, steady
        assert got["unnamed_plain"]["announced"] == 2 and got["unnamed_plain"]["cache_hits"] == 49
        assert got["unnamed_async"]["announced"] == 2 * 10 and got["unnamed_async"]["cache_hits"] == 0
        assert got["small_plain"]["in_program_order"] == 50 and got["small_plain"]["tensors"] == 0
    else:
        assert stats["announced"] == 2 * 220
        assert stats["cache_hits"] == 0
        assert steady["state_gathers"] >= 50  # every call is announced in full


@pytest.mark.parametrize("compression, algorithm", [("fp16", "auto"), ("bf16", "auto"), ("bf16", "mpi")])
def test_compression_on_the_wire(tmp_path, compression, algorithm):
    """fp16 and bf16: the values that travel, the bytes that travel, the range of each. bf16 is
    reduced by ringreduce's own algorithms even where MPI's would run (MPI has no bfloat16)."""
    job = run_job(2, "core/engine.py", "compressed", tmp_path, compression,
                  env={"RINGREDUCE_ALGORITHM": algorithm})
    assert job.returncode == 0, job.stderr[-3000:]
    wire_dtype = np.dtype(np.float16) if compression == "fp16" else ml_dtypes.bfloat16
    for rank in range(2):
        got = np.load(tmp_path / f"rank{rank}.npz")
        for key, dtype, length in (("float32", "float32", 1000), ("float64", "float64", 1000),
                                   ("large", "float32", 50_000)):
            inputs = [cases.normal(r, dtype, length).astype(wire_dtype) for r in range(2)]
            assert got[key].dtype == np.dtype(dtype)
            # At 2 ranks: each input rounded to the wire dtype, one addition there, and back.
            np.testing.assert_array_equal(got[key], (inputs[0] + inputs[1]).astype(dtype), err_msg=key)
        exact = np.sum([cases.values(r, "int32", 1000) for r in range(2)], axis=0, dtype=np.int32)
        np.testing.assert_array_equal(got["int32"], exact)
        if compression == "fp16":
            assert np.isinf(got["overflow"]).all()  # 70000 is beyond float16: documented to become inf
        else:
            np.testing.assert_allclose(got["overflow"], 140000.0, rtol=2 ** -8)  # bfloat16 has float32's range
        np.testing.assert_allclose(got["prescaled"], 140000.0, rtol=2 ** -8)
        grouped = np.concatenate([(cases.normal(0, "float32", n) + cases.normal(1, "float32", n)) / 2
                                  for n in (7, 11)])
        np.testing.assert_allclose(got["grouped"], grouped, rtol=2 ** -7, atol=2 ** -7)
        (report,) = reports(job, rank)
        # Two bytes per float on the wire, four per int32 (not compressed).
        assert report["wire"] == {"float32": 2000, "float64": 2000, "large": 100_000, "int32": 4000, "overflow": 8}


def test_join_with_uneven_batches_per_rank(tmp_path):
    job = run_job(3, "core/engine.py", "join", tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(3):
        assert reports(job, rank) == [{"last": 2}]
        got = np.load(tmp_path / f"rank{rank}.npy")
        # Step s (value s+1) is summed over the ranks that still had a batch: those with s < 3 + r.
        expected = [(s + 1) * sum(1 for r in range(3) if s < 3 + r) for s in range(3 + rank)]
        np.testing.assert_array_equal(got[:, 0], expected)


def test_a_withheld_tensor_is_reported_then_ends_the_job():
    env = {"RINGREDUCE_STALL_CHECK_TIME": "1", "RINGREDUCE_STALL_SHUTDOWN_TIME": "3"}
    job = run_job(3, "core/engine.py", "withhold", env=env, rrun_args=("--stall-stacks",), timeout=60)
    assert job.returncode != 0
    worker = os.path.join(os.path.dirname(__file__), "engine.py")
    with open(worker) as f:
        lines = list(enumerate(f, 1))
    call = next(n for n, line in lines if 'name="withheld"' in line)
    stuck = next(n for n, line in lines if "time.sleep(60)" in line)
    # The call site in the program comes with the name.
    warning = re.compile(rf"allreduce 'withheld' \(engine\.py:{call}\): submitted by ranks 0, 2 \d+ s ago, still "
                         "missing from rank 1")
    for rank in (0, 2):
        assert any(warning.search(line) for line in job.lines_of(rank, "stderr")), job.stderr
    assert "StallError: allreduce 'withheld'" in job.last_line and "missing from rank 1" in job.last_line
    # With the stacks, rank 1's shows the very line it is stuck on.
    assert any(f'core/engine.py", line {stuck} in <module>' in line for line in job.lines_of(1, "stderr")), job.stderr


def test_timeline_has_every_phase_of_every_tensor(tmp_path):
    path = tmp_path / "timeline.json"
    job = run_job(2, "core/engine.py", "timeline", rrun_args=("--timeline-filename", str(path)))
    assert job.returncode == 0, job.stderr[-3000:]
    events = json.loads(path.read_text())
    rows = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    phases = {}
    for event in events:
        if event["ph"] == "X":
            phases.setdefault(rows[event["tid"]], set()).add(event["name"])
    for step in range(3):
        for part in (0, 1):
            assert {"NEGOTIATE", "WAIT_FOR_OTHER_RANKS", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE",
                    "MEMCPY_OUT_FUSION_BUFFER"} <= phases[f"step{step}.{part}"]
        assert {"NEGOTIATE", "WAIT_FOR_OTHER_RANKS", "BROADCAST"} <= phases[f"bcast{step}"]
        assert phases[f"plain-bcast{step}"] == {"BROADCAST"}
    assert any(e["name"] == "CYCLE" for e in events)


def test_the_timeline_of_a_killed_job_still_opens(tmp_path):
    """Trace viewers accept the event array without its closing bracket, which a killed job
    never writes; every event before the kill must be complete."""
    path = tmp_path / "timeline.json"
    command = rrun_command(2, "core/engine.py", "timeline-then-hang", rrun_args=("--timeline-filename", str(path)))
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                           text=True)
    try:
        assert "steps done" in job.stdout.readline()
        time.sleep(0.5)
        job.send_signal(signal.SIGINT)
        job.wait(timeout=30)
    finally:
        job.kill()
    text = path.read_text()
    assert not text.rstrip().endswith("]")
    events = json.loads(text + "\n]")
    finished = {e["args"]["tensor"] for e in events if e["ph"] == "X" and e["name"] == "ALLREDUCE"}
    assert finished == {"step0", "step1", "step2"}


def test_straggler_report_names_the_slow_rank():
    job = run_job(3, "core/engine.py", "straggler", rrun_args=("--straggler-report",))
    assert job.returncode == 0, job.stderr[-3000:]
    (got,) = reports(job, 0)
    worst = got["report"]["ranks"][0]
    assert worst["rank"] == 2 and worst["share_last"] >= 0.8 and worst["mean_late_seconds"] >= 0.01
    table = job.lines_of(0, "stderr")
    # 20 plain calls in program order: each packet says how long its rank waited in the call before.
    assert table[0].startswith("ringreduce straggler report (19 rounds ran collectives)")
    assert table[1].startswith("  rank 2 was last in ")


def test_shutdown_with_a_request_pending():
    job = run_job(2, "core/engine.py", "shutdown-pending")
    assert job.returncode == 0, job.stderr[-3000:]
    assert reports(job, 0) == [{"error": "RingReduceError: shutdown() was called on rank 0 while allreduce "
                                         "'pending' was still pending"}]
    # Each names where rank 1 made the call it waits in (engine.py's line).
    for report, name in zip(reports(job, 1), ("pending", "after"), strict=True):
        assert re.fullmatch(rf"PeerExitedError: rank 0 shut down while rank 1 waited in allreduce '{name}' "
                            r"\(called at engine\.py:\d+ on rank 1\); every rank must make the same collective "
                            "calls", report["error"]), report


def test_poll_and_synchronize():
    job = run_job(2, "core/engine.py", "poll")
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(2):
        assert reports(job, rank) == [{"done": True, "value": [1.0, 1.0, 1.0]}]


@pytest.mark.parametrize("np", [2, 3])
def test_a_deadlock_fails_on_every_rank_within_the_grace_period_and_the_job_goes_on(np):
    job = run_job(np, "core/engine.py", "deadlock", env={"RINGREDUCE_DEADLOCK_TIME": "2"}, timeout=60)
    assert job.returncode == 0, job.stderr[-3000:]
    site = site_in("core/engine.py", 'name=f"only-on-{rank}"')
    waits = "; ".join(f"rank {r} waits in allreduce 'only-on-{r}' ({site})" for r in range(np))
    for rank in range(np):
        failed, after = reports(job, rank)
        assert failed["error"] == ("deadlock: every rank has been blocked for 2 s with nothing new submitted "
                                   f"anywhere: {waits}. Every rank must make the same collective calls "
                                   "(RINGREDUCE_DEADLOCK_TIME sets how long to wait, 0 never)")
        assert 2 <= failed["seconds"] < 2 + 5
        assert after == {"after": [np * (np + 1) / 2] * 2}


def test_a_rank_still_computing_is_no_deadlock():
    job = run_job(2, "core/engine.py", "computing", env={"RINGREDUCE_DEADLOCK_TIME": "0.5"}, timeout=60)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(2):
        assert reports(job, rank) == [{"result": [3.0, 3.0]}]
