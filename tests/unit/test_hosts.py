"""Hosts from -H, hostfiles and Slurm, and how ranks are placed on them, as rrun reads them."""

import re

import pytest

from ringreduce.launcher.cli import python_script, resolve_ranks
from ringreduce.launcher.errors import LaunchError
from ringreduce.launcher.hosts import Host, parse_hostfile, parse_hosts, place


def test_hosts_option():
    assert parse_hosts("node1:4,node2:2,node3") == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]


@pytest.mark.parametrize("text", ["node1:4,", ":4", "node1:x", "node 1:2", "node1:-1"])
def test_malformed_hosts_option(text):
    with pytest.raises(LaunchError, match="is not 'host' or 'host:slots'"):
        parse_hosts(text)


@pytest.mark.parametrize("text", ["node1;rm -rf /", "$(reboot):2", "node`id`", "a|b"])
def test_hosts_with_shell_metacharacters_are_refused(text, tmp_path):
    with pytest.raises(LaunchError, match="contains shell metacharacters"):
        parse_hosts(text)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"node0 slots=1\n{text}\n")
    with pytest.raises(LaunchError, match=r"line 2 .* contains shell metacharacters"):
        parse_hostfile(hostfile)


def test_hostfile_both_forms_comments_and_blank_lines(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the cluster\n\nnode1 slots=4   # big one\nnode2:2\n  node3\n")
    assert parse_hostfile(path) == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]


def test_hostfile_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(LaunchError, match="names no hosts"):
        parse_hostfile(empty)
    with pytest.raises(LaunchError, match="cannot read hostfile"):
        parse_hostfile(tmp_path / "missing")
    zero = tmp_path / "zero"
    zero.write_text("node1 slots=0\n")
    with pytest.raises(LaunchError, match=r"line 1 \('node1 slots=0'\): the number of slots must be at least 1"):
        parse_hostfile(zero)


def test_placement_fills_hosts_in_order():
    hosts = [Host("a", 2), Host("b", 2), Host("c", 4)]
    assert place(hosts, 3) == [("a", 2), ("b", 1)]
    assert place(hosts, 8) == [("a", 2), ("b", 2), ("c", 4)]
    with pytest.raises(LaunchError, match="-np 9 is more than the 8 slots given"):
        place(hosts, 9)


SLURM = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "4(x2)"}


def test_inside_slurm_without_np_the_allocation_decides():
    assert resolve_ranks(None, None, None, SLURM) == (8, [("n1", 4), ("n2", 4)])


def test_a_heterogeneous_job_is_refused_saying_what_to_change():
    with pytest.raises(LaunchError, match=r"heterogeneous Slurm job \(SLURM_HET_SIZE=2\).*submit one homogeneous job"):
        resolve_ranks(None, None, None, {**SLURM, "SLURM_HET_SIZE": "2"})


def test_rrun_inside_an_srun_step_is_refused_instead_of_misreading_its_task_counts():
    """In a step, SLURM_TASKS_PER_NODE is the step's ("1") and the node list the job's (2 nodes):
    rrun said the counts and the nodes did not match."""
    step = {**SLURM, "SLURM_TASKS_PER_NODE": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}
    with pytest.raises(LaunchError, match=r"inside an srun step \(SLURM_STEP_ID=0, 1 task\(s\)\).*run rrun in the "
                                          r"batch script itself, without srun"):
        resolve_ranks(None, None, None, step)


@pytest.mark.parametrize("tasks, gpus, said", [
    ("4(x2)", None, None),
    ("4(x2)", "4", None),
    ("8(x3),6", None, "the nodes run different numbers of ranks (6, 8; SLURM_TASKS_PER_NODE=8(x3),6)"),
    ("8(x2)", "1", "up to 8 ranks per node but 1 GPU(s) visible on this node (SLURM_GPUS_ON_NODE=1)"),
    ("1(x2)", "8", "1 rank(s) on a node with 8 GPUs leaves 7 of them idle (SLURM_TASKS_PER_NODE=1(x2)): ask "
                   "--ntasks-per-node=8"),
])
def test_a_slurm_layout_that_slows_a_gpu_job_is_said_and_refused_when_strict(tasks, gpus, said, capsys):
    environ = {**SLURM, "SLURM_TASKS_PER_NODE": tasks, "SLURM_JOB_NODELIST": "n[1-2]" if "x2" in tasks else "n[1-4]",
               **({"SLURM_GPUS_ON_NODE": gpus} if gpus else {})}
    resolve_ranks(None, None, None, environ)
    warned = capsys.readouterr().err
    if said is None:
        assert warned == ""
        resolve_ranks(None, None, None, environ, strict_placement=True)
        return
    assert warned.startswith(f"rrun: warning: {said}"), warned
    with pytest.raises(LaunchError, match=r"^--strict-placement: " + re.escape(said)):
        resolve_ranks(None, None, None, environ, strict_placement=True)


def test_gpus_per_task_is_warned_about_unless_srun_starts_the_ranks(capsys):
    environ = {**SLURM, "SLURM_GPUS_PER_TASK": "1"}
    resolve_ranks(None, None, None, environ)
    assert capsys.readouterr().err.startswith("rrun: warning: --gpus-per-task=1: the step in which mpiexec starts its "
                                              "daemons has one task per node")
    resolve_ranks(None, None, None, environ, launcher="srun")
    assert capsys.readouterr().err == ""


def test_np_inside_slurm_is_left_to_mpiexec_and_outside_slurm_runs_locally():
    assert resolve_ranks(3, None, None, SLURM) == (3, None)
    assert resolve_ranks(3, None, None, {}) == (3, None)


def test_hosts_without_np_use_every_slot():
    assert resolve_ranks(None, "a:2,b:1", None, {}) == (3, [("a", 2), ("b", 1)])
    with pytest.raises(LaunchError, match="not both"):
        resolve_ranks(None, "a:2", "hostfile", {})


@pytest.mark.parametrize("arguments, script", [
    (["train.py", "--lr", "0.1"], "train.py"),
    (["-u", "-W", "ignore", "-X", "dev", "train.py"], "train.py"),
    (["-m", "package.train", "x.py"], None),
    (["-c", "print(1)"], None),
    (["-mpackage"], None),
    ([], None),
])
def test_the_script_of_a_python_command_line(arguments, script):
    assert python_script(arguments) == script


def test_hostfiles_as_clusters_write_them(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("node1 slots=4 max_slots=8\nnode2 max_slots=2\nnode3\nnode3\nnode3\nnode1\n")
    assert parse_hostfile(path) == [Host("node1", 5), Host("node2", 2), Host("node3", 3)]
    path.write_text("node1 slots=4 max_slots=2\n")
    with pytest.raises(LaunchError, match=r"line 1 .*: slots=4 is more than max_slots=2"):
        parse_hostfile(path)



def test_the_job_s_end_is_asked_of_squeue_once_where_slurm_does_not_set_it(monkeypatch):
    import subprocess
    import time

    from ringreduce.launcher.slurm import job_end_time

    asked = []

    def squeue(argv, **_):
        asked.append(argv[1:])
        return subprocess.CompletedProcess(argv, 0, stdout="2026-12-07T02:43:23\n")

    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)
    end = job_end_time(SLURM, run=squeue)
    assert end == int(time.mktime((2026, 12, 7, 2, 43, 23, 0, 0, -1)))
    assert asked == [["-h", "-j", "42", "-o", "%e"]]
    assert job_end_time({**SLURM, "SLURM_JOB_END_TIME": "1796611403"}, run=squeue) is None  # Slurm's own
    assert job_end_time({}, run=squeue) is None
    unlimited = lambda argv, **_: subprocess.CompletedProcess(argv, 0, stdout="NONE\n")  # noqa: E731
    assert job_end_time(SLURM, run=unlimited) is None
