"""rrun's view of a running job: each rank's last collectives with their call sites (on a stall,
a failure, an interrupt, `rrun --dump`, SIGUSR2) and --monitor's figures, the slowest rank named."""

import json
import os
import re
import signal
import subprocess
import sys
import time

from launch import rrun_command, run_job

DUMP = [sys.executable, "-m", "ringreduce.launcher", "--dump"]
LOSS_SITE = "flight_job.py:22"  # rank 0's allreduce 'loss'


def start(*args, rrun_args=()):
    return subprocess.Popen(rrun_command(2, "launcher/flight_job.py", *args, rrun_args=rrun_args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def dump_when_waiting(job):
    """`rrun --dump PID` until rank 0 is seen waiting in 'loss' (the ranks start in a few seconds)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        shown = subprocess.run(DUMP + [str(job.pid)], capture_output=True, text=True, timeout=30)
        if "WAITING" in shown.stdout:
            return shown.stdout
        time.sleep(0.5)
    raise AssertionError(f"rank 0 never seen waiting: {shown.stdout} {shown.stderr}")


def rank_line(text, rank):
    return next(line for line in text.splitlines() if line.strip().startswith(f"rank {rank}:"))


def test_a_stall_and_a_dump_show_each_rank_s_last_collectives_and_the_job_goes_on():
    job = start("hang", 6, rrun_args=("--stall-check-seconds", "2"))
    try:
        shown = dump_when_waiting(job)
        job.send_signal(signal.SIGUSR2)  # the same, on rrun's stderr
        stdout, stderr = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 0, stderr
    # Rank 0 waits in 'loss', for rank 1, which made 40 allreduces and is elsewhere.
    waiting = rank_line(shown, 0)
    assert re.search(rf"#40 allreduce 'loss' float32\[3\] at {LOSS_SITE}, WAITING [\d.]+ s for rank 1$", waiting)
    assert "#39 allreduce 'grad.39' float32[10] at flight_job.py:19" in waiting
    assert rank_line(shown, 1).endswith("#39 allreduce 'grad.39' float32[10] at flight_job.py:19, "
                                        + rank_line(shown, 1).rsplit(", ", 1)[1])
    assert "WAITING" not in rank_line(shown, 1)
    # The stall, shown once by rrun while the job went on (and the job ended well).
    assert stderr.count("a collective has waited 2 s or more") == 1, stderr
    assert re.search(rf"rank 0: .*'loss'.* at {LOSS_SITE}, WAITING", stderr)
    usr2 = stderr[stderr.index("(asked for while the job runs)"):]
    assert re.search(rf"rank 0: .*'loss'.* at {LOSS_SITE}, WAITING [\d.]+ s for rank 1", usr2)


def test_an_interrupted_job_shows_and_files_every_rank_s_last_collectives():
    job = start("hang", 120)
    try:
        dump_when_waiting(job)
        job.send_signal(signal.SIGINT)
        _, stderr = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 128 + signal.SIGINT
    assert "rrun: stopped by SIGINT; every rank was ended" in stderr
    block = stderr[stderr.index("(the job was stopped by SIGINT)"):]
    assert re.search(rf"rank 0: .*'loss'.* at {LOSS_SITE}, WAITING [\d.]+ s for rank 1", block)
    path = re.search(r"every rank's last collectives are in (\S+)", block).group(1)
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    with open(path) as file:
        records = json.load(file)["ranks"]
    assert sorted(records) == ["0", "1"]
    # All 32 kept (the default), oldest first, the latest of rank 0 the one it waits in.
    zero = records["0"]["records"]
    assert [r["seq"] for r in zero] == list(range(9, 41))
    assert zero[-1]["name"] == "loss" and zero[-1]["done"] is None and zero[-1]["waiting_for"] == [1]
    assert all(r["done"] >= r["submitted"] for r in zero[:-1])
    assert [r["name"] for r in records["1"]["records"]][-1] == "grad.39"


def test_the_monitor_names_the_slowed_rank_and_a_failure_shows_the_last_collectives():
    job = run_job(3, "launcher/flight_job.py", "slow", 6, rrun_args=("--monitor",))
    assert job.returncode == 1, job.stderr
    lines = [line for line in job.stderr.splitlines() if line.startswith("rrun monitor:")]
    assert any(line.endswith("slowest: rank 1") for line in lines), lines
    slowest = next(line for line in lines if "slowest: rank 1" in line)
    behind = [float(x) for x in re.findall(r"([\d.]+) ms behind", slowest)]
    assert behind[1] > 10 and behind[0] < 5 and behind[2] < 5, lines
    # The program sees the same figures: rank 1 came ~20 ms behind, waited least.
    recent = json.loads(job.lines_of(0)[-1].removeprefix("report "))
    assert max(recent, key=lambda row: row["mean_behind_seconds"])["rank"] == 1
    assert min(recent, key=lambda row: row["wait_share"])["rank"] == 1
    assert recent[1]["mean_behind_seconds"] > 0.01
    # Rank 2 raised after the barrier: its last collective is the barrier, done.
    block = job.stderr[job.stderr.index("(the job failed)"):]
    assert re.search(r"rank 2: .*barrier .* at flight_job.py:33, [\d.]+ ms$", block, re.M), block
