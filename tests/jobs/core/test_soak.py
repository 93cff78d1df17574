"""A short soak: random collectives (op, dtype, size, order, async) across 3 ranks, each checked
against numpy. `make soak` runs a long one."""

import json

import pytest

from launch import run_job


@pytest.mark.parametrize("count, env", [
    (2000, {}),
    (600, {"RINGREDUCE_ALGORITHM": "ring", "RINGREDUCE_PIPELINE_CHUNK_BYTES": "4096"}),
    (600, {"RINGREDUCE_ALGORITHM": "shm", "RINGREDUCE_SHM_PIECE_BYTES": "12345"}),
], ids=["auto", "ring-pieces", "shm-pieces"])
def test_random_collectives_all_match_numpy(count, env):
    job = run_job(3, "core/soak.py", count, 17, env=env, timeout=110)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(3):
        (report,) = [json.loads(s[len("REPORT "):]) for s in job.lines_of(rank) if s.startswith("REPORT ")]
        assert report["checked"] == count
        assert report["mismatched"] == 0, report["mismatches"]
