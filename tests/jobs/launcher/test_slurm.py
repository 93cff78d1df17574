"""Slurm for real on the two-host test cluster (tests/cluster/slurm_up.sh): batch scripts that
exec rrun, srun as the launcher, binding, a preemption notice and a lost node. They skip, saying
why, where the cluster or Slurm cannot run, and fail instead under RINGREDUCE_REQUIRE_CLUSTER=1."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch
import torch_cases

from ringreduce import checkpoint

from launch import JOBS, ON_HOSTA, SLURM_CONF, TESTS, python_of, require_cluster, slurm_missing

PYTHON = sys.executable
RRUN = f"{PYTHON} -m ringreduce.launcher -i rrnet0"
# The cluster's nodes as two-socket GPU nodes (tests/cluster/slurm_up.sh): four placeholder GPUs
# each, 0-1 near CPU 0 and 2-3 near CPU 1, shown by a placeholder nvidia-smi; the emulated CuPy
# gives a job's ranks those four GPUs.
GPU_NODES = (f"export PATH={os.path.join(os.path.dirname(SLURM_CONF), 'bin')}:$PATH "
             f"PYTHONPATH={os.path.join(TESTS, 'support', 'emulated_cupy')} EMULATED_CUPY_DEVICES=4")


@pytest.fixture(autouse=True)
def slurm_cluster():
    if slurm_missing():
        require_cluster(slurm_missing())


def slurm(*command, timeout=120):
    """A Slurm command, run on hosta."""
    return subprocess.run(ON_HOSTA + list(command), env=dict(os.environ, SLURM_CONF=SLURM_CONF),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def batch(tmp_path, body, *sbatch_args, wait=True):
    """Submit a batch script; with `wait`, return when it has ended, its exit status as the result's
    returncode (polled: sbatch --wait looks every 10 s or so). (result, its output file)"""
    script, output = tmp_path / "job.sh", tmp_path / "job.out"
    script.write_text(f"#!/bin/sh\n{body}\n")
    result = slurm("sbatch", "--parsable", "-o", str(output), *sbatch_args, str(script), timeout=60)
    if wait and result.returncode == 0:
        result.returncode = ended_with(result.stdout.strip().split(";")[0], seconds=170)
    return result, output


def ended_with(job, seconds):
    """Job `job`'s exit status once it has ended (128 + N for a script killed by signal N)."""
    until_ended(job, seconds)
    shown = slurm("scontrol", "show", "job", "-o", job).stdout
    code, signum = (int(n) for n in re.search(r"\bExitCode=(\d+):(\d+)", shown).groups())
    return code or (128 + signum if signum else 0)


def until_ended(job, seconds):
    """Wait for Slurm job `job` to leave the queue (a test failure after `seconds`)."""
    deadline = time.monotonic() + seconds
    while slurm("squeue", "-h", "-j", job).stdout.strip():
        assert time.monotonic() < deadline, f"job {job} did not end in {seconds} s"
        time.sleep(0.3)


def ranks_said(output):
    """Each rank's JSON line of the job's output, by rank."""
    lines = [line.split(":", 1) for line in output.read_text().splitlines() if line.startswith("[")]
    return {int(tag[1:tag.index("]")]): json.loads(text) for tag, text in lines if tag.endswith("<stdout>")}


def test_a_batch_script_that_execs_rrun_runs_where_slurm_placed_it_without_ssh(tmp_path):
    """No ssh anywhere (a `ssh` that always fails comes first on PATH): rrun checks no host, and
    mpiexec starts its daemons through Slurm. Every rank is bound to a core as asked."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text("#!/bin/sh\necho 'ssh is not allowed here' >&2\nexit 255\n")
    (fake / "ssh").chmod(0o755)
    result, output = batch(tmp_path, f"export PATH={fake}:$PATH\nexec {RRUN} --bind-to core {PYTHON} "
                                     f"{JOBS}/launcher/slurm_job.py", "-N", "2", "--ntasks-per-node=1")
    assert result.returncode == 0, output.read_text()[-3000:] if output.exists() else result.stderr
    said = ranks_said(output)
    assert sorted(said) == [0, 1] and {s["host"] for s in said.values()} == {"hosta", "hostb"}
    assert all(s["size"] == 2 and s["sum"] == [3.0, 3.0, 3.0] and len(s["cpus"]) == 1 for s in said.values())


def test_rrun_with_srun_as_the_launcher_keeps_tagged_output_and_names_a_killed_rank(tmp_path):
    """`rrun --launcher srun`: srun starts rrun's wrapper with Slurm's PMI (no mpiexec, no ssh), so
    the lines carry the rank, torchrun's variables are set, and a rank killed on the other node is
    named by rrun."""
    result, output = batch(tmp_path, f"exec {RRUN} --launcher srun {PYTHON} {JOBS}/launcher/slurm_job.py",
                           "-N", "2", "--ntasks-per-node=1")
    assert result.returncode == 0, output.read_text()[-3000:] if output.exists() else result.stderr
    said = ranks_said(output)
    assert sorted(said) == [0, 1] and {s["host"] for s in said.values()} == {"hosta", "hostb"}
    assert all(s["size"] == 2 and s["sum"] == [3.0, 3.0, 3.0] for s in said.values())
    assert [said[r]["local_rank"] for r in (0, 1)] == ["0", "0"] and said[1]["group_rank"] == "1"
    result, output = batch(tmp_path, f"exec {RRUN} --launcher srun {PYTHON} {JOBS}/launcher/misbehave.py sigkill",
                           "-N", "2", "--ntasks-per-node=1")
    assert result.returncode != 0
    assert "rrun: rank 1 (on hostb) failed first: killed by signal 9 (SIGKILL)" in output.read_text(), \
        output.read_text()[-2000:]


def test_an_uneven_layout_is_warned_about_and_refused_when_strict(tmp_path):
    """Three tasks on two nodes: Slurm places 2 and 1 (SLURM_TASKS_PER_NODE=2,1)."""
    result, output = batch(tmp_path, f"exec {RRUN} {PYTHON} {JOBS}/launcher/slurm_job.py", "-N", "2", "-n", "3",
                           "--oversubscribe")
    said = output.read_text()
    assert result.returncode == 0 and "rrun: warning: the nodes run different numbers of ranks (1, 2; " \
        "SLURM_TASKS_PER_NODE=2,1)" in said, said[-2000:]
    assert sorted(ranks_said(output)) == [0, 1, 2]
    result, output = batch(tmp_path, f"exec {RRUN} --strict-placement {PYTHON} -c pass", "-N", "2", "-n", "3",
                           "--oversubscribe")
    assert result.returncode == 2 and "Error: --strict-placement: the nodes run different numbers of ranks" \
        in output.read_text(), output.read_text()[-2000:]


def test_gpus_slurm_allocates_per_task_or_left_idle_are_warned_about(tmp_path):
    """The test cluster's nodes have two placeholder GPUs each (tests/cluster/slurm_up.sh)."""
    result, output = batch(tmp_path, f"exec {RRUN} {PYTHON} {JOBS}/launcher/slurm_job.py", "-N", "2",
                           "--ntasks-per-node=2", "--gpus-per-task=1")
    said = output.read_text()
    assert result.returncode == 0 and "rrun: warning: --gpus-per-task=1: the step in which mpiexec starts its " \
        "daemons has one task per node" in said, said[-2000:]
    result, output = batch(tmp_path, f"exec {RRUN} {PYTHON} {JOBS}/launcher/slurm_job.py", "-N", "2",
                           "--ntasks-per-node=1", "--gpus-per-node=2")
    said = output.read_text()
    assert result.returncode == 0 and "rrun: warning: 1 rank(s) on a node with 2 GPUs leaves 1 of them idle " \
        "(SLURM_TASKS_PER_NODE=1(x2)): ask --ntasks-per-node=2" in said, said[-2000:]


def test_a_heterogeneous_job_is_refused_in_one_line(tmp_path):
    result, output = batch(tmp_path, f"exec {RRUN} {PYTHON} -c pass", "-N", "1", ":", "-N", "1")
    assert result.returncode == 2, result.stderr
    assert "Error: this is a heterogeneous Slurm job (SLURM_HET_SIZE=2)" in output.read_text(), output.read_text()


def test_a_loop_asking_with_a_margin_commits_before_the_time_limit(tmp_path):
    """--time=1: Slurm's projected end is a minute away (rrun asks squeue: Slurm 22.05 sets no
    SLURM_JOB_END_TIME); a loop asking stop_requested(within=55) stops at one step on both nodes
    about 5 s in, and the job ends by itself (at the limit, Slurm's SIGTERM ended it: status 143)."""
    checkpoints = tmp_path / "checkpoints"
    result, output = batch(tmp_path, f"exec {RRUN} {PYTHON} {JOBS}/launcher/preempted.py {checkpoints} 55",
                           "-N", "2", "--ntasks-per-node=1", "--time=1", wait=False)
    assert result.returncode == 0, result.stderr
    until_ended(result.stdout.strip().split(";")[0], seconds=50)
    assert "rrun:" not in output.read_text(), output.read_text()[-2000:]  # no rank failed, no signal came
    stopped = [line for line in output.read_text().splitlines() if "stopped at step" in line]
    assert len(stopped) == 2 and len({line.split(":", 1)[1] for line in stopped}) == 1, output.read_text()
    assert "TIME LIMIT" not in output.read_text()
    (saved,) = checkpoints.glob("checkpoint-*.rr")
    assert checkpoint.read(saved)["step"] == int(stopped[0].rsplit(" ", 1)[1])


@pytest.mark.parametrize("per_node, cpus_per_task", [(2, 1), (1, 2)])
def test_under_srun_each_rank_keeps_slurm_s_binding_and_as_many_threads(tmp_path, per_node, cpus_per_task):
    """The test cluster binds tasks (task/affinity): with --launcher srun each rank runs on the CPUs
    Slurm gave its task, apart from the node's other ranks, with that many OpenMP threads."""
    result, output = batch(tmp_path, f"exec {RRUN} --launcher srun {PYTHON} {JOBS}/launcher/slurm_job.py", "-N", "2",
                           f"--ntasks-per-node={per_node}", f"--cpus-per-task={cpus_per_task}")
    assert result.returncode == 0, output.read_text()[-3000:]
    said = ranks_said(output)
    assert sorted(said) == list(range(2 * per_node))
    assert all(len(s["cpus"]) == cpus_per_task and s["threads"] == str(cpus_per_task) for s in said.values()), said
    for host in ("hosta", "hostb"):
        cpus = [cpu for s in said.values() if s["host"] == host for cpu in s["cpus"]]
        assert len(cpus) == len(set(cpus)) == per_node * cpus_per_task, said


@pytest.mark.parametrize("launch, gpus, cpus", [
    # Slurm binds local ranks 0 and 2 to socket 1, 1 and 3 to socket 0: each drives a GPU of its socket.
    ("--launcher srun --mpi-args=--cpu-bind=map_cpu:1,0", [2, 0, 3, 1], [1, 0, 1, 0]),
    # mpiexec places them; --bind-to gpu binds local rank r to the socket of GPU r.
    ("--bind-to gpu --report-bindings", [0, 1, 2, 3], [0, 0, 1, 1]),
])
def test_eight_ranks_on_two_gpu_nodes_each_drive_their_own_gpu_near_their_cpus(tmp_path, launch, gpus, cpus):
    """2 nodes x 4 tasks (more tasks than the nodes' two CPUs: --overcommit), four GPUs a node."""
    result, output = batch(tmp_path, f"{GPU_NODES}\nexec {RRUN} {launch} {PYTHON} {JOBS}/launcher/slurm_job.py --gpu",
                           "-N", "2", "-n", "8", "--overcommit", "--exclusive", "--gpus-per-node=4")
    assert result.returncode == 0, output.read_text()[-3000:]
    said = ranks_said(output)
    assert sorted(said) == list(range(8)) and all(s["sum"] == [36.0] * 3 for s in said.values()), said
    for host in ("hosta", "hostb"):
        local = sorted((int(s["local_rank"]), s) for s in said.values() if s["host"] == host)
        assert [s["gpu"] for _, s in local] == gpus, said
        assert [s["cpus"] for _, s in local] == [[cpu] for cpu in cpus], said
        assert all(s["threads"] == "1" for _, s in local), said  # one CPU, shared by two ranks
    if "--report-bindings" in launch:
        assert "near GPU 3 (0000:04:00.0)" in output.read_text(), output.read_text()[-3000:]


def test_rrun_started_by_srun_is_refused_in_one_line_naming_the_step(tmp_path):
    """Inside a step, Slurm's task counts are the step's and its node list the job's: rrun said they
    did not match. Now it says where it runs and what to do instead."""
    result, output = batch(tmp_path, f"srun -N 1 -n 1 {RRUN} {PYTHON} -c pass", "-N", "2", "--ntasks-per-node=1")
    said = output.read_text()
    assert result.returncode == 2 and "Error: rrun runs inside an srun step (SLURM_STEP_ID=0, 1 task(s)), whose task " \
        "counts (SLURM_TASKS_PER_NODE='1') are the step's" in said, said[-2000:]


def test_a_torchrun_script_in_a_batch_script_runs_under_rrun_across_the_nodes(tmp_path):
    """tests/jobs/torch/torch_distributed.py on gloo, exec'd by rrun in a two-node allocation:
    torchrun's variables come from where Slurm placed the ranks, and DDP trains as one process.
    Each task gets both of its node's CPUs: bound to one, with the machine busy, rank 1 sometimes
    aborted in torch's teardown after rank 0, which hosts the TCPStore under rrun, had exited
    (docs/torch_distributed.md)."""
    result, output = batch(tmp_path, f"exec {RRUN} {PYTHON} {JOBS}/torch/torch_distributed.py {tmp_path} gloo",
                           "-N", "2", "--ntasks-per-node=1", "--cpus-per-task=2")
    assert result.returncode == 0, output.read_text()[-3000:] if output.exists() else result.stderr
    torch_cases.assert_torchrun_across_two_hosts(
        [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)])


def test_srun_starts_the_ranks_and_init_names_a_world_mpi_does_not_see():
    good = slurm("srun", "-N", "2", "-n", "2", "--mpi=pmi2", PYTHON, f"{JOBS}/launcher/slurm_job.py")
    assert good.returncode == 0, good.stderr[-3000:]
    said = [json.loads(line) for line in good.stdout.splitlines()]
    assert sorted(s["rank"] for s in said) == [0, 1] and all(s["sum"] == [3.0, 3.0, 3.0] for s in said)
    wrong = slurm("srun", "-N", "2", "-n", "2", "--mpi=none", PYTHON, f"{JOBS}/launcher/slurm_job.py")
    assert wrong.returncode != 0
    assert "srun started 2 tasks in this step but MPI reports a world of 1" in wrong.stderr, wrong.stderr[-3000:]


@pytest.mark.parametrize("scancel_args, mpi, launch", [
    (["--signal=USR1", "--batch"], "mpich", ""), ([], "mpich", ""),
    (["--signal=USR1", "--batch"], "openmpi", ""), ([], "openmpi", "--launcher srun")],
    ids=["usr1-to-the-script", "scancel", "usr1-to-the-script-openmpi", "scancel-openmpi-srun"])
def test_a_preemption_notice_to_the_batch_script_makes_every_rank_commit_and_exit(tmp_path, scancel_args, mpi,
                                                                                  launch):
    """A notice to the batch script, which rrun passes to every rank through the MPI's daemons; or
    scancel's SIGTERM to every process of the job at once (MPICH's daemons let the ranks finish;
    Open MPI's end them within a second, so under Open MPI srun starts the ranks: Slurm gives them
    KillWait); each rank's stop_requested() turns true at one step."""
    checkpoints, python = tmp_path / "checkpoints", python_of(mpi)
    result, output = batch(tmp_path, f"exec {RRUN.replace(PYTHON, python)} {launch} {python} "
                           f"{JOBS}/launcher/preempted.py {checkpoints}", "-N", "2", "--ntasks-per-node=1", wait=False)
    assert result.returncode == 0, result.stderr
    job = result.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while not (output.exists() and "training" in output.read_text()):
        ended = not slurm("squeue", "-h", "-j", job).stdout.strip()
        assert time.monotonic() < deadline and not ended, output.read_text()[-3000:] if output.exists() else job
        time.sleep(0.2)
    assert slurm("scancel", *scancel_args, job).returncode == 0
    until_ended(job, seconds=60)
    stopped = {path.name: path.read_text() for path in checkpoints.glob("stopped-rank*")}
    assert sorted(stopped) == ["stopped-rank0", "stopped-rank1"] and len(set(stopped.values())) == 1, \
        (stopped, output.read_text()[-3000:])
    (saved,) = checkpoints.glob("checkpoint-*.rr")
    step = int(stopped["stopped-rank0"])
    state = checkpoint.read(saved)
    assert state["step"] == step and state["weights"].tolist() == [2.0 * step] * 4  # both ranks' step, summed


def test_a_rank_lost_on_the_other_node_ends_the_job_and_is_named(tmp_path):
    result, output = batch(tmp_path, f"exec {RRUN} {PYTHON} {JOBS}/launcher/misbehave.py sigkill",
                           "-N", "2", "--ntasks-per-node=1")
    assert result.returncode != 0
    last = output.read_text().strip().splitlines()[-1]
    assert last == "rrun: rank 1 (on hostb) failed first: killed by signal 9 (SIGKILL)", output.read_text()[-2000:]
