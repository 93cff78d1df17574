"""Elastic jobs through the real rrun and MPI (tests/workers/elastic_train.py): a job that grows when
the discovery script reports more slots, and one job that goes through every failure kind and every
phase, one per generation, each going on from its last commit and ending with the parameters of one
process that replays the same sizes from the same commits; under Open MPI's ULFM, survivors that go
on in place. The hosts' own storage, a lost host and a cut link are in test_cluster.py. Pure logic
(setting hosts aside, reading the discovery script, the sampler's split) here too."""

import importlib.util
import json
import os
import socket
import stat
import time

import pytest
import torch

from ringreduce.launcher import elastic, link, protocol
from ringreduce.launcher.errors import LaunchError

from launch import WORKERS, python_of, run_job

_spec = importlib.util.spec_from_file_location("elastic_train", os.path.join(WORKERS, "elastic_train.py"))
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def replay(epochs, schedule):
    """The worker's training in one process, where the generation that resumed at step s ran
    schedule[s] ranks: each step averages the ranks' mean gradients over the batches an
    ElasticSampler gives them. Returns (weight, bias)."""
    dataset = worker.data()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step, epoch, processed, size = 0, 0, 0, schedule[0]
    while epoch < epochs:
        size = schedule.get(step, size)
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(1 + epoch)).tolist()
        rest, start = order[processed:], processed
        slices = [rest[r::size][:len(rest) // size] for r in range(size)]
        resized = False
        for j in range(len(slices[0]) // worker.BATCH):
            if j > 0 and step in schedule:
                resized = True
                break
            optimizer.zero_grad()
            grads = [torch.zeros_like(p) for p in model.parameters()]
            for part in slices:
                model.zero_grad()
                x, y = dataset[part[j * worker.BATCH:(j + 1) * worker.BATCH]]
                torch.nn.functional.mse_loss(model(x), y).backward()
                grads = [g + p.grad for g, p in zip(grads, model.parameters(), strict=True)]
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g / size
            optimizer.step()
            step += 1
            processed = start + (j + 1) * worker.BATCH * size
        if not resized:
            epoch, processed = epoch + 1, 0
    return model.weight.detach().flatten().tolist(), model.bias.item()


def events(job, kind):
    """The worker's `kind` lines (rank 0's, or every rank's FINAL), parsed."""
    lines = [line.split(" ", 1)[1] for rank in range(8) for line in job.lines_of(rank) if line.startswith(kind + " ")]
    return [json.loads(line) for line in lines]


def discovery_script(tmp_path, lines):
    """A discovery script that prints a file the test (or the worker) can change."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(line + "\n" for line in lines))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, hosts


def assert_matches_replay(job, epochs):
    resumed = events(job, "RESUMED")
    schedule = {r["step"]: r["size"] for r in resumed}
    weight, bias = replay(epochs, schedule)
    finals = events(job, "FINAL")
    assert len(finals) == resumed[-1]["size"]
    # What a mismatch needs to be understood: the generations, the commits, and what rrun said.
    story = "\n".join([json.dumps(r) for r in resumed] + [line for line in job.lines_of(0) if line.startswith("COMMIT")]
                      + [line for line in job.stderr.splitlines() if line.startswith("rrun:")])
    for final in finals:
        torch.testing.assert_close(final["weight"], weight, rtol=1e-9, atol=1e-12, msg=lambda m: f"{m}\n{story}")
        torch.testing.assert_close(final["bias"], bias, rtol=1e-9, atol=1e-12, msg=lambda m: f"{m}\n{story}")
    return resumed


def test_the_replay_can_tell_sizes_apart():
    """The check below would catch a job that ran at another size than it says."""
    assert replay(2, {0: 2}) != replay(2, {0: 2, 9: 3})


def test_a_job_grows_at_its_next_commit_when_discovery_reports_more_slots(tmp_path):
    script, hosts = discovery_script(tmp_path, ["localhost:2"])
    job = run_job(2, "elastic_train.py", 2, "--grow-file", hosts, 4, "localhost:1", "--sleep", 0.15,
                  rrun_args=("--min-np", "2", "--max-np", "3", "--host-discovery-script", script), timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    resumed = assert_matches_replay(job, 2)
    assert [(r["generation"], r["size"]) for r in resumed] == [(0, 2), (1, 3)]
    assert resumed[1]["step"] % 3 == 0 and resumed[1]["step"] > 4  # at the first commit after the notice
    assert resumed[1]["resets"] == [3]  # the reset callbacks ran, at the new size
    assert "rrun: discovery: 3 usable slots for 2 ranks; the ranks resize at their next commit" in job.stderr
    assert "rrun: generation 1: 3 ranks on localhost:3" in job.stderr
    assert not os.path.exists(f"/dev/shm/ringreduce-commits-{job_id(job)}")  # removed at the end


def test_a_job_that_grows_at_an_epochs_end_commit_resumes_at_the_next_epoch(tmp_path):
    """At 3 ranks an epoch is 16 steps: the last commit inside it is at step 15, so a notice that
    comes during step 16 resizes the job at the epoch's end commit. The next generation starts the
    next epoch (a worker that committed before advancing its epoch trained one epoch twice: CI saw
    it once, as a replay mismatch of the cut-link test)."""
    script, hosts = discovery_script(tmp_path, ["localhost:3"])
    job = run_job(3, "elastic_train.py", 2, "--grow-file", hosts, 15, "localhost:1",
                  rrun_args=("--min-np", "2", "--max-np", "4", "--host-discovery-script", script), timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    resumed = assert_matches_replay(job, 2)
    assert [(r["size"], r["step"], r["epoch"], r["processed"]) for r in resumed] == [(3, 0, 0, 0), (4, 16, 1, 0)]


def job_id(job):
    return next(line.split("job ")[1].split()[0] for line in job.stderr.splitlines() if "rrun: elastic job " in line)


class TestLogic:
    def test_a_failed_host_is_set_aside_for_the_cooldown_doubled_with_each_failure(self):
        now = [0.0]
        aside = elastic.SetAside((10, 25), clock=lambda: now[0])
        hosts = [elastic.hosts.Host("a", 2), elastic.hosts.Host("b", 2)]
        assert aside.add("b") == 10 and [h.name for h in aside.usable(hosts)] == ["a"]
        now[0] = 10
        assert [h.name for h in aside.usable(hosts)] == ["a", "b"]
        assert aside.add("b") == 20 and aside.add("b") == 25  # doubled, at most the range's top

    def test_without_a_cooldown_a_failed_host_stays_aside(self):
        aside = elastic.SetAside(None, clock=lambda: 1e9)
        aside.add("a")
        assert aside.usable([elastic.hosts.Host("a", 1)]) == [] and "a (for good)" in aside.describe()

    def test_the_discovery_script_s_lines(self, tmp_path):
        script, _ = discovery_script(tmp_path, ["# hosts", "a:2", "b", "a:1"])
        with pytest.raises(LaunchError, match="without slots"):
            elastic.discover(str(script), None)
        assert elastic.discover(str(script), 4) == [elastic.hosts.Host("a", 3), elastic.hosts.Host("b", 4)]
        failing = tmp_path / "fail.sh"
        failing.write_text("#!/bin/sh\necho broken >&2\nexit 2\n")
        failing.chmod(0o755)
        with pytest.raises(LaunchError, match="exited with status 2: broken"):
            elastic.discover(str(failing), None)

    def test_the_sampler_gives_the_rest_of_the_epoch_once_after_a_resize(self, monkeypatch):
        from ringreduce import runtime
        from ringreduce.torch.elastic import ElasticSampler

        dataset = list(range(50))
        taken = []

        def parts(size, batches):
            samplers = []
            for rank in range(size):
                monkeypatch.setattr(runtime, "size", lambda: size)
                monkeypatch.setattr(runtime, "rank", lambda rank=rank: rank)
                sampler = ElasticSampler(dataset, seed=3)
                sampler.load_state_dict(state)
                samplers.append(sampler)
            for sampler in samplers:
                taken.extend(list(sampler)[:batches * 2])
                sampler.record_batch(batches - 1, 2)
            return samplers[0].state_dict()

        state = {"epoch": 1, "processed": 0}
        state = parts(2, 5)  # 20 of 50 taken at 2 ranks
        assert state == {"epoch": 1, "processed": 20}
        state = parts(3, 5)  # 30 of the remaining 30 at 3 ranks
        assert sorted(taken) == list(range(50))

    def test_a_rank_s_host_name_is_found_among_the_discovery_script_s(self):
        import socket

        assert elastic.placement_host(socket.gethostname(), ["localhost"]) == "localhost"
        assert elastic.placement_host("hostb", ["hosta.example", "hostb.example"]) == "hostb.example"
        assert elastic.placement_host("elsewhere", ["localhost"]) == "elsewhere"
        assert elastic.placement_host(None, ["localhost"]) is None


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
    job = run_job(2, "elastic_train.py", 3, "--plan", json.dumps(PLAN),
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
    """tests/workers/tf_elastic.py: rank 1 exits as epoch 2 begins; the next generation's model and
    optimizer are those of the commit at epoch 1's end, and fit goes on from epoch 2."""
    script, _ = discovery_script(tmp_path, ["localhost:2"])
    job = run_job(2, "tf_elastic.py", rrun_args=("--min-np", "2", "--host-discovery-script", script,
                                                 "--blacklist-cooldown-range", "0", "0"), timeout=150)
    assert job.returncode == 0, job.stderr[-3000:]
    resumed, committed = events(job, "RESUMED"), events(job, "COMMITTED")
    assert [c["epoch"] for c in committed] == [1, 2, 3, 4]
    assert resumed[1] == committed[1] and resumed[1]["iterations"] == 10  # exactly the state committed
    finals = events(job, "FINAL")
    assert len(finals) == 2 and finals[0] == finals[1]


def test_under_open_mpi_with_ulfm_the_survivors_of_a_killed_rank_go_on_in_place(tmp_path):
    """Open MPI shrinks the job (ULFM): rank 2 of 3 is killed at step 7 and ranks 0 and 1 go on in
    their processes, in the same generation, from commit 6, ending with the parameters of that
    schedule."""
    script, _ = discovery_script(tmp_path, ["localhost:3"])
    python = python_of("openmpi")
    job = run_job(3, "elastic_train.py", 2, "--die", "kill", "rank2", 7, python=python,
                  rrun_args=("--min-np", "2", "--host-discovery-script", script), timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    resumed = assert_matches_replay(job, 2)
    assert [(r["generation"], r["size"], r["step"]) for r in resumed] == [(0, 3, 0), (0, 2, 6)]
    assert resumed[1]["resets"] == [2]
    assert "rrun: rank 2 (on " in job.stderr and "the 2 others go on in place from their last commit" in job.stderr
    died = events(job, "DYING")[0]["time"]
    assert resumed[1]["time"] - died < 3, resumed[1]["time"] - died


def _kinds_heard(address, seconds=1.5):
    """The kinds of the notices a rank connecting to rrun's link at `address` hears in `seconds`."""
    host, port = address.rsplit(":", 1)
    heard, received = [], b""
    with socket.create_connection((host, int(port)), timeout=seconds) as connection:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                received += connection.recv(65536)
            except TimeoutError:
                break
            *lines, received = received.split(b"\n")
            heard += [json.loads(line)["kind"] for line in lines]
    return [kind for kind in heard if kind != "beat"]


def test_a_rank_that_connects_after_the_hosts_changed_is_told_too():
    """Discovery may find the hosts changed before a generation's ranks have connected to rrun's link
    (still importing their framework): an announced notice reaches them when they connect; one for
    the ranks connected at the time does not; a new generation starts without the last one's."""
    server = link.LinkServer(timeout=30)
    try:
        address = server.env(["localhost"])[protocol.LINK_VARIABLE]
        server.watch(None)
        server.notify("rank-failed", why="only for the ranks connected")
        server.announce("hosts-updated")
        assert _kinds_heard(address) == ["hosts-updated"]
        server.watch(None)
        assert _kinds_heard(address) == []
    finally:
        server.close()
