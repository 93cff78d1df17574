"""The cost model in real jobs: `rrun --calibrate` saves a profile that `explain` and jobs use, a
profile's choice is the algorithm that runs (and stays exact), calibrating at init gives every
rank the same choice, and a broken profile fails every rank naming its file."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np

from ringreduce.algorithms import cost
from ringreduce.planning import calibration, profiles

from launch import run_job


def _rrun(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "ringreduce.launcher", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})), stdin=subprocess.DEVNULL)


def _choice_job(tmp_path, size, env):
    job = run_job(size, "planning/cost_choice.py", tmp_path, env=env, timeout=100)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(size):
        got = np.load(tmp_path / f"rank{rank}.npz")
        for n in (10, 100_000, 3_000_000):
            expected = np.arange(n, dtype=np.float64) * sum(r + 1 for r in range(size))
            np.testing.assert_array_equal(got[f"n{n}"], expected)
    report = next(line for line in job.lines_of(0) if line.startswith("REPORT "))
    return [tuple(row) for row in json.loads(report[len("REPORT "):])]


def test_rrun_calibrate_saves_a_profile_that_explain_and_jobs_use(tmp_path):
    path = tmp_path / "profile.json"
    calibrated = _rrun("-np", "2", "--calibrate", "--profile", str(path))
    assert calibrated.returncode == 0, calibrated.stderr[-3000:]
    assert f"saved the profile measured on 2 ranks, 1 host(s) to {path}" in calibrated.stdout
    profile = profiles.load(path)
    assert profile.source == str(path) and profile.host.alpha > 0 and profile.combine.memory > 0
    assert set(profile.calls) == {"ring", "halving_doubling", "tree", "mpi", "shm"}
    assert profile.core_cache_bytes == calibration._caches().get(2, 0)
    assert (profile.host.fresh is not None) == (profile.core_cache_bytes >= 64 << 10)
    assert profile.shm_handover >= 0.0 and profile.shm_handover < 1e-8  # under 10 ns a byte, on any machine
    explained = _rrun("-np", "3", "--explain", "--profile", str(path))
    assert explained.returncode == 0, explained.stderr
    assert f"cost model profile: {path}" in explained.stdout and "choice for 3 ranks on 1 host(s):" in explained.stdout
    # A job under the saved profile makes the choice --explain showed for its shape.
    table = _choice_job(tmp_path, 3, {"RINGREDUCE_PROFILE": str(path)})
    assert table == cost.Model(profile, cost.JobShape(3)).table("allreduce")


def test_a_profile_where_the_tree_is_cheapest_runs_the_tree_and_stays_exact(tmp_path):
    path = profiles.save(dataclasses.replace(cost.DEFAULT, calls={**cost.DEFAULT.calls, "mpi": 1.0, "shm": 1.0,
                                                               "ring": 1.0, "halving_doubling": 1.0}),
                     tmp_path / "tree.json")
    table = _choice_job(tmp_path, 3, {"RINGREDUCE_PROFILE": str(path)})
    assert table[0] == (0, "tree") and all(start > 24_000_000 for start, _ in table[1:])  # all the job's sizes


def test_calibrating_at_init_gives_every_rank_the_same_choice(tmp_path):
    table = _choice_job(tmp_path, 2, {"RINGREDUCE_CALIBRATE": "1", "RINGREDUCE_PROFILE": str(tmp_path / "none")})
    assert table[0][0] == 0 and all(family in cost.Model(cost.DEFAULT, cost.JobShape(2)).candidates("allreduce")
                                    for _, family in table)


def test_a_broken_profile_fails_every_rank_with_its_name(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("not json")
    job = run_job(2, "planning/cost_choice.py", tmp_path, env={"RINGREDUCE_PROFILE": str(broken)}, timeout=60)
    assert job.returncode != 0
    for rank in range(2):
        assert f"[{rank}]<stderr>:ValueError: {broken} is not a ringreduce cost profile" in job.stderr, job.stderr


def test_calibrate_takes_no_command():
    result = _rrun("-np", "2", "--calibrate", "python", "train.py")
    assert result.returncode != 0 and "--calibrate runs its own probe: give no command with it" in result.stderr

