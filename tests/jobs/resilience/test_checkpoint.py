"""Checkpoints and rrun --restarts: a killed rank costs at most the steps since the last commit."""

import json

import torch

from launch import run_job


def test_checkpoints_are_kept_atomic_and_damaged_ones_skipped(tmp_path):
    job = run_job(2, "resilience/checkpoints.py", tmp_path / "ck", timeout=60)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(2):
        (line,) = [json.loads(s[len("REPORT "):]) for s in job.lines_of(rank) if s.startswith("REPORT ")]
        # Rank 0 wrote; the oldest of four went; no temporary file is left.
        assert line["files"] == ["checkpoint-000000020.rr", "checkpoint-000000030.rr", "checkpoint-000000040.rr"]
        assert line["latest"] == [40, {"step": 40, "rank": 0, "payload": list(range(40))}]
        assert line["after_damage"] == [20, {"step": 20, "rank": 0, "payload": list(range(20))}]
        assert line["empty"] == [None, None]
    warnings = job.lines_of(0, "stderr")
    assert any("checkpoint-000000040.rr: truncated" in w for w in warnings), warnings
    assert any("checkpoint-000000030.rr: its contents do not match their checksum" in w for w in warnings), warnings


def test_a_killed_rank_restarts_from_the_last_commit_and_ends_where_an_unbroken_run_ends(tmp_path):
    import torch

    broken, unbroken = tmp_path / "broken", tmp_path / "unbroken"
    broken.mkdir()
    unbroken.mkdir()
    job = run_job(2, "resilience/torch_restart.py", "KILL", tmp_path / "ck1", broken, rrun_args=("--restarts", "1"),
                  timeout=150)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "rrun: rank 1 (on " in job.stderr and "killed by signal 9 (SIGKILL)" in job.stderr
    assert "rrun: starting the job again (1 of 1 restarts) after it failed with status 137" in job.stderr
    reference = run_job(2, "resilience/torch_restart.py", "NOKILL", tmp_path / "ck2", unbroken, timeout=150)
    assert reference.returncode == 0, reference.stderr[-3000:]
    for rank in range(2):
        lines = job.lines_of(rank)
        second_run = lines[lines.index("run 1 starts at step 5"):]  # the commit after step 4
        assert second_run[1:] == [f"ran step {s}" for s in range(5, 20)]
        got, expected = torch.load(broken / f"rank{rank}.pt"), torch.load(unbroken / f"rank{rank}.pt")
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=0)


KINDS = ("error-feedback", "powersgd")


def test_compressor_state_is_kept_per_rank_and_a_restart_continues_with_it(tmp_path):
    """Error-feedback residuals and PowerSGD's state differ per rank: each rank saves its own
    beside the checkpoint, and a restore of the same size ends bit for bit where an uninterrupted
    run does. Without a rank's file the restore says so, starts that state afresh on every rank,
    and ends elsewhere (so the comparison can fail)."""
    job = run_job(2, "resilience/torch_compression_restart.py", tmp_path / "ck", tmp_path, timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]

    def state(kind, which, rank):
        return torch.load(tmp_path / f"{kind}-{which}-rank{rank}.pt")

    def same(a, b):
        return all(torch.equal(a[name], b[name]) for name in a)

    for kind in KINDS:
        assert (tmp_path / f"{kind}-files.txt").read_text().split() == [
            "checkpoint-000000003.rank0-of-2.rr", "checkpoint-000000003.rank1-of-2.rr", "checkpoint-000000003.rr"]
        for rank in range(2):
            assert same(state(kind, "through", rank), state(kind, "resumed", rank))
        assert not same(state(kind, "through", 0), state(kind, "afresh", 0))
        assert (f"ringreduce: checkpoint 3 in {tmp_path / 'ck' / kind}: no state of rank 1 of 2 ranks; the per-rank "
                "state (compression residuals) starts afresh") in job.stderr
