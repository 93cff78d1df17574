"""Elastic jobs through the real rrun and MPI (tests/jobs/resilience/elastic_train.py): a job that
grows when the discovery script reports more slots, and one job that goes through every failure
kind and every phase, one per generation, each going on from its last commit and ending with the
parameters of one process that replays the same sizes from the same commits; under Open MPI's
ULFM, survivors that go on in place. The hosts' own storage, a lost host and a cut link are in
tests/jobs/launcher/test_cluster.py."""

import json
import os

import pytest
from elastic_replay import assert_matches_replay, discovery_script, events

from launch import python_of, run_job


def test_a_job_grows_at_its_next_commit_when_discovery_reports_more_slots(tmp_path):
    script, hosts = discovery_script(tmp_path, ["localhost:2"])
    job = run_job(2, "resilience/elastic_train.py", 2, "--grow-file", hosts, 4, "localhost:1", "--sleep", 0.15,
                  rrun_args=("--min-np", "2", "--max-np", "3", "--host-discovery-script", script), timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    resumed = assert_matches_replay(job, 2)
    assert [(r["generation"], r["size"]) for r in resumed] == [(0, 2), (1, 3)]
    assert resumed[1]["step"] % 3 == 0 and resumed[1]["step"] > 4  # at the first commit after the notice
    assert resumed[1]["resets"] == [3]  # the reset callbacks ran, at the new size
    rendezvous = [r["torchrun"] for r in resumed]  # torchrun's variables, new for each generation
    assert [(t["RANK"], t["WORLD_SIZE"], t["MASTER_ADDR"]) for t in rendezvous] == [
        ("0", "2", "127.0.0.1"), ("0", "3", "127.0.0.1")]
    assert all(0 < int(t["MASTER_PORT"]) < 65536 for t in rendezvous)
    assert "rrun: discovery: 3 usable slots for 2 ranks; the ranks resize at their next commit" in job.stderr
    assert "rrun: generation 1: 3 ranks on localhost:3" in job.stderr
    assert not os.path.exists(f"/dev/shm/ringreduce-commits-{job_id(job)}")  # removed at the end


def test_a_job_that_grows_at_an_epochs_end_commit_resumes_at_the_next_epoch(tmp_path):
    """At 3 ranks an epoch is 16 steps: the last commit inside it is at step 15, so a notice that
    comes during step 16 resizes the job at the epoch's end commit. The next generation starts the
    next epoch (a worker that committed before advancing its epoch trained one epoch twice: CI saw
    it once, as a replay mismatch of the cut-link test)."""
    script, hosts = discovery_script(tmp_path, ["localhost:3"])
    job = run_job(3, "resilience/elastic_train.py", 2, "--grow-file", hosts, 15, "localhost:1",
                  rrun_args=("--min-np", "2", "--max-np", "4", "--host-discovery-script", script), timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    resumed = assert_matches_replay(job, 2)
    assert [(r["size"], r["step"], r["epoch"], r["processed"]) for r in resumed] == [(3, 0, 0, 0), (4, 16, 1, 0)]


@pytest.mark.parametrize("how", ["kill", "segfault", "exception"])
def test_a_rank_that_dies_on_a_host_that_answers_starts_there_again_from_the_last_commit(tmp_path, how):
    """One workstation (localhost:3), no cool-down: rank 1 dies at step 7 (SIGKILL, SIGSEGV, an
    uncaught exception), after the commit of step 6. Its host answers, so the next generation runs
    the same 3 ranks there, from step 6, and the job ends with the parameters of one process
    replaying that."""
    script, _ = discovery_script(tmp_path, ["localhost:3"])
    job = run_job(3, "resilience/elastic_train.py", 2, "--die", how, "rank1", 7,
                  rrun_args=("--min-np", "2", "--max-np", "3", "--host-discovery-script", script), timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    resumed = assert_matches_replay(job, 2)
    assert [(r["generation"], r["size"], r["step"]) for r in resumed] == [(0, 3, 0), (1, 3, 6)]
    verdict = next(line for line in job.stderr.splitlines() if " failed first: " in line)
    assert verdict.startswith("rrun: rank 1 (on ") and HOW_RRUN_SAYS[how] in verdict, verdict
    assert "rrun: localhost answers: its ranks start there again" in job.stderr
    assert "aside" not in job.stderr


def test_a_rank_that_fails_at_every_start_sets_its_host_aside_and_the_job_ends_at_once(tmp_path):
    """Rank 1 raises in every generation before its first commit (in the forward pass of the first,
    then in a reset callback, as a rank that cannot start would): after two tries
    localhost is set aside for good, no host can come back, and rrun says so in one line instead
    of waiting --elastic-timeout (600 s)."""
    script, _ = discovery_script(tmp_path, ["localhost:2"])
    plan = [["exception", "forward"]] + [["exception", "resize"]] * 3
    job = run_job(2, "resilience/elastic_train.py", 2, "--plan", json.dumps(plan),
                  rrun_args=("--min-np", "2", "--host-discovery-script", script), timeout=120)
    assert job.returncode == 2, job.stderr[-3000:]
    failed = "failed first: exited with status 1; its last error line: RuntimeError: the training step failed"
    assert job.stderr.count(failed) == 2, job.stderr[-3000:]
    assert "rrun: localhost answers: its ranks start there again" in job.stderr
    assert ("rrun: setting localhost aside for good (its ranks failed 2 times in a row without a commit; the last: "
            "rank 1 (on ") in job.stderr
    assert job.stderr.rstrip().splitlines()[-1].startswith(
        "Error: no host can run the job: 0 usable slots, --min-np is 2, and none comes back; set aside: "
        "localhost (for good: its ranks failed 2 times in a row without a commit; the last: rank 1 (on "), job.stderr


def job_id(job):
    return next(line.split("job ")[1].split()[0] for line in job.stderr.splitlines() if "rrun: elastic job " in line)


# One failure per generation (a reset callback, the resize phase, runs from generation 1 on). Every
# phase meets a hung rank, a death that Python never sees (SIGKILL, SIGSEGV) and one it unwinds
# (an exception, os._exit), and every kind comes in two phases: how a rank dies decides what rrun
# sees, the phase where the others are. 12 failures (13 generations); all 20 pairs took 95-130 s.
PLAN = [["kill", "forward"], ["segfault", "resize"], ["exception", "resize"], ["hang", "resize"],
        ["exception", "forward"], ["hang", "forward"], ["segfault", "allreduce"], ["exit", "allreduce"],
        ["hang", "allreduce"], ["kill", "commit"], ["exit", "commit"], ["hang", "commit"]]
HOW_RRUN_SAYS = {"kill": "killed by signal 9 (SIGKILL)", "segfault": "killed by signal 11 (SIGSEGV)",
                 "exception": "RuntimeError: the training step failed", "exit": "exited with status 3",
                 "hang": "StallError"}


@pytest.mark.timeout(300)  # 13 generations: 40-80 s on the 2-core VMs
def test_every_failure_kind_and_phase_ends_its_generation_and_loses_no_commit(tmp_path):
    """One job, one failure per generation (rank 1 fails; a hung rank is caught by the stall
    shutdown): rrun names each, the next generation resumes from the last commit (or the one being
    confirmed, which rank 0 had written), and the job ends with the parameters of that schedule."""
    script, _ = discovery_script(tmp_path, ["localhost:2"])
    job = run_job(2, "resilience/elastic_train.py", 3, "--plan", json.dumps(PLAN),
                  rrun_args=("--min-np", "2", "--host-discovery-script", script, "--blacklist-cooldown-range", "0",
                             "0", "--stall-check-seconds", "1", "--stall-shutdown-seconds", "2"), timeout=240)
    assert job.returncode == 0, job.stderr[-3000:]
    resumed = assert_matches_replay(job, 3)
    assert [r["generation"] for r in resumed] == list(range(len(PLAN) + 1)), resumed
    verdicts = [line for line in job.stderr.splitlines() if " failed first: " in line]
    assert len(verdicts) == len(PLAN), verdicts
    for (kind, phase), verdict in zip(PLAN, verdicts, strict=True):
        rank = "rank 0" if kind == "hang" else "rank 1"  # the stall shutdown fails the rank that waits
        assert verdict.startswith(f"rrun: {rank} (on ") and HOW_RRUN_SAYS[kind] in verdict, (kind, phase, verdict)
    commits = [[int(line.split()[1]) for line in chunk.splitlines() if line.startswith("[0]<stdout>:COMMIT")]
               for chunk in job.stdout.split("RESUMED")[1:]]
    for generation, (kind, phase) in enumerate(PLAN):
        before = [resumed[generation]["step"]] + commits[generation]
        assert resumed[generation + 1]["step"] in (before[-1], before[-1] + 3 * (phase == "commit")), \
            (generation, kind, phase, before, resumed[generation + 1])


def test_keras_state_resumes_fit_from_the_last_epoch_committed(tmp_path):
    """tests/jobs/resilience/tf_elastic.py: rank 1 exits as epoch 2 begins; the next generation's model and
    optimizer are those of the commit at epoch 1's end, and fit goes on from epoch 2."""
    script, _ = discovery_script(tmp_path, ["localhost:2"])
    job = run_job(2, "resilience/tf_elastic.py", rrun_args=("--min-np", "2", "--host-discovery-script", script,
                                                 "--blacklist-cooldown-range", "0", "0"), timeout=150)
    assert job.returncode == 0, job.stderr[-3000:]
    resumed, committed = events(job, "RESUMED"), events(job, "COMMITTED")
    assert [c["epoch"] for c in committed] == [1, 2, 3, 4]
    assert resumed[1] == committed[1] and resumed[1]["iterations"] == 10  # exactly the state committed
    finals = events(job, "FINAL")
    assert len(finals) == 2 and finals[0] == finals[1]


def test_under_open_mpi_with_ulfm_the_survivors_of_a_killed_rank_go_on_in_place(tmp_path):
    """Open MPI shrinks the job (ULFM): rank 2 of 3 is killed at step 7 and ranks 0 and 1 go on in
    their processes, in the same generation, from commit 6 (the peer's death seen first in a plain
    call's meeting is a rank failure there, not a mismatch: 1 run in 6 failed so). The slot it left
    is usable again and --max-np is 3, so at a commit after rrun's next discovery (every second;
    steps take 50 ms) the job grows back to 3 ranks on the same host (the survivors leave without MPI's finalize,
    which waited on the dead rank: 3 runs in 10 hung), ending with the parameters of that
    schedule."""
    script, _ = discovery_script(tmp_path, ["localhost:3"])
    python = python_of("openmpi")
    job = run_job(3, "resilience/elastic_train.py", 3, "--die", "kill", "rank2", 7, "--sleep", 0.05, python=python,
                  rrun_args=("--min-np", "2", "--max-np", "3", "--host-discovery-script", script), timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    resumed = assert_matches_replay(job, 3)
    assert [(r["generation"], r["size"], r["step"]) for r in resumed[:2]] == [(0, 3, 0), (0, 2, 6)]
    assert [(r["generation"], r["size"]) for r in resumed[2:]] == [(1, 3)] and resumed[2]["step"] > 6, resumed
    assert resumed[1]["resets"] == [2]
    assert "rrun: discovery: 3 usable slots for 2 ranks; the ranks resize at their next commit" in job.stderr
    assert "sent no heartbeat" not in job.stderr
    assert "rrun: rank 2 (on " in job.stderr and "the 2 others go on in place from their last commit" in job.stderr
    died = events(job, "DYING")[0]["time"]
    assert resumed[1]["time"] - died < 3, resumed[1]["time"] - died

