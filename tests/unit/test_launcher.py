"""rrun's checks before a job starts: no mpiexec anywhere, an mpiexec of another MPI, whether the
MPI shrinks a job in place, Slurm's placement, and a launcher whose world the MPI does not see."""

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ringreduce.launcher import dialects, rank, reach
from ringreduce.launcher.cli import main
from ringreduce.launcher.supervise import Supervisor
from ringreduce.machine.launch import launch_mismatch


def test_no_mpiexec_anywhere_gives_the_install_hint(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from ringreduce.launcher.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("RRUN_MPIEXEC", raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    result = CliRunner().invoke(main, ["-np", "2", "/bin/sh", str(script)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "Error: no mpiexec found beside Python or on PATH: install one with `pip install ringreduce[mpich]` "
        "(or the site's MPI), or name it with --mpiexec / RRUN_MPIEXEC")


@pytest.mark.parametrize(("support", "expected"), [("yes", (True, "")), ("no", (False, "built without it"))])
def test_whether_a_job_shrinks_in_place_is_what_ompi_info_says(tmp_path, support, expected):
    """The one decision elastic jobs and --check-build share (dialects.shrinks_in_place)."""
    info = tmp_path / "ompi_info"
    info.write_text(f"#!/bin/sh\necho options:ft_mpi_support:{support}\n")
    info.chmod(0o755)
    in_place, why = dialects.shrinks_in_place(str(tmp_path / "mpiexec"), dialects.OpenMPI())
    assert in_place == expected[0] and expected[1] in why
    assert dialects.shrinks_in_place(str(tmp_path / "mpiexec"), dialects.MPICH())[0] is False


def test_mpiexec_of_another_mpi_is_detected_at_init():
    """A rank that finds itself alone in a world rrun meant to be bigger says why."""
    result = subprocess.run([sys.executable, "-c", "import ringreduce as rr; rr.init()"],
                            capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, RRUN_WORLD_SIZE="2"))
    assert result.returncode != 0
    assert "rrun started 2 ranks but MPI reports a world of 1" in result.stderr


def test_a_slurm_placement_needs_no_ssh_check(monkeypatch):
    """Inside an allocation mpiexec starts its daemons through Slurm: hosts from -H are checked
    over ssh, hosts from Slurm are not."""
    checked = []
    monkeypatch.setattr(reach, "check_reachable", checked.append)
    monkeypatch.setattr(Supervisor, "run", lambda self: 0)
    slurm_env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    for variable, value in slurm_env.items():
        monkeypatch.setenv(variable, value)
    assert CliRunner().invoke(main, [sys.executable, "-c", "pass"]).exit_code == 0
    assert checked == []
    assert CliRunner().invoke(main, ["-H", "a:2,b:2", sys.executable, "-c", "pass"]).exit_code == 0
    assert checked == [["a", "b"]]


@pytest.mark.parametrize("world, environ, says", [
    (4, {"RRUN_WORLD_SIZE": "4"}, None),
    (1, {"RRUN_WORLD_SIZE": "4"}, "rrun started 4 ranks but MPI reports a world of 1: the mpiexec that rrun ran"),
    (1, {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2"},
     "srun started 4 tasks in this step but MPI reports a world of 1: srun and the MPI that mpi4py loaded (X)"),
    (4, {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2"}, None),
    # rrun started Open MPI's daemons through srun: their step has one task per node.
    (4, {"RRUN_WORLD_SIZE": "4", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}, None),
    (1, {"SLURM_STEP_NUM_TASKS": "4", "SLURM_JOB_ID": "9"}, None),  # a batch script's python, not a task of a step
    (1, {}, None),
])
def test_init_names_a_launcher_whose_world_mpi_does_not_see(world, environ, says):
    problem = launch_mismatch(world, environ)
    assert (problem is None) == (says is None)
    if says:
        assert problem.format(library="X").startswith(says)



@pytest.mark.parametrize("mine, node, local, cpus_per_task, threads", [
    (range(8), range(8), 4, None, 2),  # unbound: the host's ranks share every CPU
    (range(8), range(8), 1, None, 8),
    (range(16), range(32), 8, None, 4),  # bound to one of 2 NUMA domains, 4 ranks on each
    ([5], range(32), 8, None, 1),  # bound to a core
    (range(8), range(8), 4, "3", 3),  # Slurm's --cpus-per-task
    (range(2), range(64), 1, "16", 2),  # never more than the rank may run on
    (range(8, 16), range(8, 16), 2, None, 4),  # a cgroup of 8 CPUs of a bigger node
])
def test_each_rank_threads_are_its_cpus_divided_among_the_ranks_that_share_them(mine, node, local, cpus_per_task,
                                                                               threads):
    environ = {"MPI_LOCALNRANKS": str(local), **({"SLURM_CPUS_PER_TASK": cpus_per_task} if cpus_per_task else {})}
    assert rank.threads_per_rank(environ, mine, node) == threads


def test_the_time_left_comes_from_slurm_s_projected_end():
    from ringreduce.resilience import preemption

    assert preemption.seconds_left({}, now=100.0) is None
    assert preemption.seconds_left({"SLURM_JOB_END_TIME": "0"}, now=100.0) is None  # no limit
    assert preemption.seconds_left({"SLURM_JOB_END_TIME": "400"}, now=100.0) == 300.0
    assert preemption.near_end(300, {"SLURM_JOB_END_TIME": "400"}, now=100.0)
    assert not preemption.near_end(299, {"SLURM_JOB_END_TIME": "400"}, now=100.0)
    assert not preemption.near_end(None, {"SLURM_JOB_END_TIME": "400"}, now=399.0)  # only when asked with a margin


def test_srun_as_the_launcher_takes_no_hosts_of_its_own():
    result = CliRunner().invoke(main, ["--launcher", "srun", "-H", "a:1", sys.executable, "-c", "pass"])
    assert result.exit_code == 2, result.output
    assert "--launcher srun places the ranks as the Slurm allocation does" in result.output
