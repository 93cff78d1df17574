"""rrun as a user meets it: tagged output, one-line errors, signals that leave nothing behind."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from ringreduce import checkpoint
from ringreduce.launcher.cli import environment, fabric_environment

from launch import python_of, rrun_command, run_job

RRUN = [sys.executable, "-m", "ringreduce.launcher"]


def rrun(*args, env=None, timeout=60):
    return subprocess.run(RRUN + list(args), capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})), stdin=subprocess.DEVNULL)


def one_line_error(result):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_every_line_carries_its_rank_and_stream(mpi_python):
    job = run_job(2, "launcher/chatter.py", python=mpi_python)
    assert job.returncode == 0, job.stderr
    for rank in range(2):
        assert job.lines_of(rank) == [f"hello from {rank} of 2", "second line", "no newline at the end"]
        assert job.lines_of(rank, "stderr") == [f"warning from {rank}"]
    assert all(line.startswith(("[0]<stdout>:", "[1]<stdout>:")) for line in job.stdout.splitlines())


@pytest.mark.parametrize("args, message", [
    (["-np", "2", sys.executable, "no_such_script.py"], "Error: script not found: no_such_script.py"),
    (["-np", "2", "no-such-program-xyz"], "Error: command not found: no-such-program-xyz"),
    (["-np", "5", "-H", "localhost:2,other:2", sys.executable, "-c", "pass"],
     "Error: -np 5 is more than the 4 slots given (localhost:2, other:2)"),
    (["-np", "2", "-H", "good:2,bad host:2", sys.executable, "-c", "pass"],
     "Error: -H entry 'bad host:2' is not 'host' or 'host:slots' or 'host slots=N'"),
    (["-np", "2", "-H", "node1:0", sys.executable, "-c", "pass"],
     "Error: -H entry 'node1:0': the number of slots must be at least 1"),
    (["-np", "2", "--mpiexec", "/no/such/mpiexec", sys.executable, "-c", "pass"],
     "Error: mpiexec '/no/such/mpiexec' (from --mpiexec or RRUN_MPIEXEC) does not exist"),
    ([sys.executable, "-c", "pass"], "Error: give the number of ranks with -np (or hosts with -H or --hostfile)"),
    (["-np", "2"], "Error: give the command to run, e.g. `rrun -np 2 python train.py`"),
    (["-np", "2", "-x", "RRUN_TEST_UNSET_VARIABLE", sys.executable, "-c", "pass"],
     "Error: -x RRUN_TEST_UNSET_VARIABLE: the variable is not set here, so there is nothing to forward"),
])
def test_mistakes_give_one_line_errors(args, message):
    assert one_line_error(rrun(*args)) == message


def test_an_unreachable_host_is_named_before_mpi_starts():
    # 127.0.0.2 is loopback, but not this host's name: rrun tries ssh, which nothing answers.
    message = one_line_error(rrun("-np", "2", "-H", "localhost:1,127.0.0.2:1", sys.executable, "-c", "pass"))
    assert message.startswith("Error: cannot reach 1 of the hosts over ssh (127.0.0.2: ssh: connect to host "
                              "127.0.0.2 port 22: Connection refused)"), message


@pytest.mark.parametrize("variables, message", [
    ({"SLURM_JOB_NODELIST": "node[01-"},
     "Error: cannot read the Slurm node list 'node[01-': its brackets do not pair up"),
    ({"SLURM_JOB_NODELIST": "node[a-c]"},
     "Error: cannot read the Slurm node list 'node[a-c]': 'a-c' is not a number or a range N-M"),
    ({"SLURM_TASKS_PER_NODE": "2(x)"}, "Error: cannot read SLURM_TASKS_PER_NODE '2(x)': '2(x)' is not N or N(xM)"),
    ({"SLURM_TASKS_PER_NODE": "2(x3)"}, "Error: the Slurm allocation names 2 nodes (SLURM_JOB_NODELIST='node[1-2]') "
                                        "but 3 task counts (SLURM_TASKS_PER_NODE='2(x3)')"),
])
def test_a_malformed_slurm_allocation_is_named(variables, message):
    allocation = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert one_line_error(rrun(sys.executable, "-c", "pass", env={**allocation, **variables})) == message


def test_malformed_hostfile_line_is_named(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1 slots=2\nnode2 slots=two\n")
    assert one_line_error(rrun("--hostfile", str(hostfile), sys.executable, "-c", "pass")) == (
        f"Error: hostfile {hostfile} line 3 ('node2 slots=two') is not 'host' or 'host:slots' "
        "or 'host slots=N'")


def test_dry_run_prints_the_mpiexec_command(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    result = rrun("--dry-run", "-np", "3", "-i", "lo", "-x", "FOO=bar", "--mpi-args", "-verbose",
                  sys.executable, str(script), "--epochs", "2")
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    mpiexec = next(i for i, word in enumerate(words) if "=" not in word)  # the variables come first
    assert os.path.basename(words[mpiexec]) == "mpiexec" and "FOO=bar" in words[:mpiexec]
    text = result.stdout
    assert " -n 3 " in text and " -iface lo " in text
    assert text.strip().endswith(f"-verbose {sys.executable} -m ringreduce.launcher.rank 3 -- "
                                 f"{sys.executable} {script} --epochs 2")


@pytest.mark.parametrize("flags, variables", [
    (("--algorithm", "shm", "--no-hierarchical-allreduce"), "RINGREDUCE_ALGORITHM=shm RINGREDUCE_HIERARCHICAL=0 "),
    (("--hierarchical-allreduce", "--cycle-time-ms", "2.5"), "RINGREDUCE_HIERARCHICAL=1 RINGREDUCE_CYCLE_TIME=2.5 "),
    (("--gpu-transport", "staged"), "RINGREDUCE_GPU_TRANSPORT=staged "),
])
def test_knob_flags_set_their_variables(tmp_path, flags, variables):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    result = rrun("--dry-run", "-np", "2", *flags, sys.executable, str(script))
    assert result.returncode == 0, result.stderr
    assert variables in result.stdout
    assert "HIERARCHICAL" not in rrun("--dry-run", "-np", "2", sys.executable, str(script)).stdout


def test_verbose_hides_the_values_of_secret_looking_variables(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    result = rrun("--dry-run", "-np", "2", "-x", "WANDB_API_KEY=abc123", "-x", "HF_TOKEN=xyz789",
                  "-x", "DATA_DIR=/data", sys.executable, str(script))
    assert result.returncode == 0, result.stderr
    assert "abc123" not in result.stdout and "xyz789" not in result.stdout
    words = result.stdout.split()
    assert {"WANDB_API_KEY=HIDDEN", "HF_TOKEN=HIDDEN", "RINGREDUCE_JOB_SECRET=HIDDEN", "DATA_DIR=/data"} <= set(words)
    assert "-genvlist" in words  # mpiexec's command line names them only


def test_a_secret_given_with_x_is_in_no_command_line_but_the_ranks_have_it(tmp_path):
    """While the job runs, no process of it shows the value in its command line (ps reads them)."""
    marker = f"rr-secret-{os.getpid()}"
    script = tmp_path / "show.py"
    script.write_text("import os, time, psutil\n"
                      "time.sleep(1.0)\n"  # every rank has started: look at the job's processes
                      "leaks = [p.pid for p in psutil.process_iter(['cmdline'])\n"
                      f"         if '{marker}' in ' '.join(p.info['cmdline'] or [])]\n"
                      "print('SEEN', os.environ['WANDB_API_KEY'], 'LEAKS', leaks, flush=True)\n")
    result = rrun("-np", "2", "-x", "WANDB_API_KEY", sys.executable, str(script), env={"WANDB_API_KEY": marker})
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(f"SEEN {marker} LEAKS []") == 2, result.stdout


def test_help_says_how_gpus_are_assigned_to_ranks():
    result = rrun("--help")
    assert result.returncode == 0, result.stderr
    assert ("each rank takes the GPU nearest the CPUs it may run on (local rank mod the host's GPU count when "
            "unbound)") in " ".join(result.stdout.split())


def test_check_build_reports_the_installation():
    result = rrun("--check-build")
    assert result.returncode == 0, result.stderr
    assert "ringreduce v0.1.0" in result.stdout
    assert "[X] mpi4py 4." in result.stdout
    assert "[X] persistent collectives (MPI_Allreduce_init)" in result.stdout  # MPICH 5 has them
    assert "[X] mpiexec " in result.stdout and "(MPICH)" in result.stdout
    assert "[ ] fault tolerance (ULFM): MPICH's fault tolerance did not work here" in result.stdout
    assert "Available frameworks:" in result.stdout
    assert "GPU arrays and their transports (the first one checked is the default):\n    [" in result.stdout


def test_check_build_says_open_mpi_5_can_shrink_a_job_in_place():
    python = python_of("openmpi")
    result = subprocess.run([python, "-m", "ringreduce.launcher", "--check-build"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "on Open MPI v5" in result.stdout
    assert "[X] fault tolerance (ULFM: revoke, shrink, agree; mpiexec --with-ft ulfm)" in result.stdout


def fake_mpiexec(tmp_path, version_text):
    path = tmp_path / "mpiexec"
    path.write_text(f"#!/bin/sh\necho '{version_text}'\n")
    path.chmod(0o755)
    return str(path)


def test_check_build_warns_when_mpiexec_and_mpi4py_disagree(tmp_path):
    result = rrun("--check-build", "--mpiexec", fake_mpiexec(tmp_path, "mpiexec (Open MPI) 4.1.4"))
    assert result.returncode == 0, result.stderr
    assert "(Open MPI)" in result.stdout
    assert "[!] mpi4py uses MPICH but this mpiexec is Open MPI: the ranks would not find each other" in result.stdout


def test_an_mpiexec_rrun_does_not_know_is_named(tmp_path):
    mpiexec = fake_mpiexec(tmp_path, "FancyMPI launcher 9.9")
    assert one_line_error(rrun("-np", "2", "--mpiexec", mpiexec, sys.executable, "-c", "pass")) == (
        f"Error: {mpiexec} is not an MPI that rrun knows (its --version says: FancyMPI launcher 9.9); "
        "rrun speaks Open MPI, MPICH and Intel MPI")


def _processes_with(marker):
    """Every process of the job: rrun, mpiexec, the wrappers and the ranks all carry the marker."""
    return [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]


def _sleeping_ranks(marker):
    return [p for p in _processes_with(marker) if p.info["cmdline"][1].endswith("launcher/misbehave.py")]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_rrun_ends_every_rank(signum, mpi_python):
    marker = f"marker-{uuid.uuid4().hex}"
    rrun_process = subprocess.Popen(rrun_command(2, "launcher/misbehave.py", "sleep", marker, python=mpi_python),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(_sleeping_ranks(marker)) < 2:
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.2)
        time.sleep(1.0)  # let the ranks reach their sleep
        rrun_process.send_signal(signum)
        signalled = time.monotonic()
        _, stderr = rrun_process.communicate(timeout=30)
        ended_within = time.monotonic() - signalled
    finally:
        rrun_process.kill()
    assert ended_within < 5, ended_within  # every rank gets the signal, and rrun waits a grace period at most
    assert rrun_process.returncode == 128 + signum
    assert stderr.decode().strip().splitlines()[-1] == (
        f"rrun: stopped by {signal.Signals(signum).name}; every rank was ended")
    assert [p.info["cmdline"] for p in _processes_with(marker)] == []


def test_forwarded_families_fabric_options_and_no_secrets():
    environ = {"NCCL_DEBUG": "INFO", "UCX_TLS": "rc,sm", "FI_PROVIDER": "verbs", "OMPI_MCA_pml": "ucx",
               "MPIR_CVAR_CH4_NETMOD": "ofi", "I_MPI_DEBUG": "5", "PMIX_MCA_gds": "hash", "RINGREDUCE_CYCLE_TIME": "2",
               "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_SECRET_TOKEN": "x", "HOME": "/root",
               "NCCL_IB_PKEY": "0x8001", "UCX_IB_PKEY": "0x8001", "RINGREDUCE_S3_ACCESS_KEY": "k"}
    env = environment((), environ)
    # Partitioned InfiniBand's keys are fabric settings, not secrets: they pass.
    assert env == {k: v for k, v in environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "NCCL_SECRET_TOKEN", "HOME",
                                                                 "RINGREDUCE_S3_ACCESS_KEY")}
    assert environment((), environ, secret_patterns=[""])["NCCL_SECRET_TOKEN"] == "x"  # --secret-names ''
    assert "RINGREDUCE_S3_ACCESS_KEY" in environment((), environ, secret_patterns=["*TOKEN*"])
    # NCCL keeps its own HCA per GPU unless --nccl-ib-hca names them (one list for all took that away).
    assert fabric_environment("ib0", "mlx5_0:1,mlx5_1:1") == {"NCCL_SOCKET_IFNAME": "ib0",
                                                             "UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1"}
    assert fabric_environment(None, None, "=mlx5_0:1") == {"NCCL_IB_HCA": "=mlx5_0:1"}
    assert one_line_error(rrun("-np", "2", "--net-device", "ib0", sys.executable, "-c", "pass")).startswith(
        "Error: --net-device 'ib0': name HCA ports like mlx5_0:1 (see ibv_devinfo); an IP interface such as ib0 "
        "would make UCX run TCP over IPoIB")


@pytest.mark.parametrize("bind_to, separate", [("core", True), ("none", False)])
def test_binding_is_what_was_asked_and_reported(bind_to, separate, mpi_python):
    job = run_job(2, "launcher/affinity.py", rrun_args=("--bind-to", bind_to, "--report-bindings"), python=mpi_python)
    assert job.returncode == 0, job.stderr
    cpus = [json.loads(job.lines_of(rank)[0]) for rank in range(2)]
    if separate:
        assert all(len(c) == 1 for c in cpus) and cpus[0] != cpus[1]
    else:
        assert cpus[0] == cpus[1] == sorted(os.sched_getaffinity(0))
    for rank in range(2):
        assert re.search(rf"rrun: rank {rank} on \S+ is bound to CPUs ", job.stderr), job.stderr


def test_bind_to_gpu_without_a_gpu_leaves_the_ranks_where_mpiexec_placed_them_and_says_so():
    """The GPU side is tested on topologies as data (tests/unit/test_gpu_placement.py); here, that a
    job asked to bind near GPUs on a host without one runs, unbound, and says why."""
    job = run_job(2, "launcher/affinity.py", rrun_args=("--bind-to", "gpu", "--report-bindings"), timeout=60)
    assert job.returncode == 0, job.stderr
    assert [json.loads(job.lines_of(r)[0]) for r in range(2)] == [sorted(os.sched_getaffinity(0))] * 2
    for rank in range(2):
        assert re.search(rf"rrun: rank {rank} on \S+ is bound to CPUs \S+ \(--bind-to gpu: no NVIDIA GPU in sysfs or "
                         r"nvidia-smi, so left as mpiexec placed it\)", job.stderr), job.stderr


@pytest.mark.parametrize("signum, status", [(signal.SIGUSR1, 0), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_a_preemption_notice_lets_every_rank_commit_and_exit(signum, status, mpi_python, tmp_path):
    """rrun passes SIGUSR1 on to every rank (a scheduler's notice, e.g. Slurm's --signal=B:USR1@120
    to a batch script that exec's rrun); SIGTERM ends the job after --grace-seconds. Either way
    ringreduce.stop_requested() becomes true on every rank at the same step."""
    process = subprocess.Popen(
        rrun_command(2, "launcher/preempted.py", tmp_path, python=mpi_python, rrun_args=("--grace-seconds", "30")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert "training" in process.stdout.readline()
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == status, stderr
    (saved,) = list(tmp_path.glob("checkpoint-*.rr"))
    step = checkpoint.read(saved)["step"]
    if signum == signal.SIGUSR1:
        assert sorted(stdout.splitlines()[-2:]) == [f"[0]<stdout>:stopped at step {step}",
                                                    f"[1]<stdout>:stopped at step {step}"]


def test_a_loop_that_asks_with_a_margin_commits_before_the_job_s_time_limit(tmp_path):
    """stop_requested(within=S) turns true on every rank, at one step, once Slurm's projected end of
    the job (SLURM_JOB_END_TIME) is S seconds away, with no signal at all."""
    end = int(time.time()) + 6
    job = run_job(2, "launcher/preempted.py", tmp_path, 3, env={"SLURM_JOB_END_TIME": str(end)}, timeout=60)
    finished = time.time()
    assert job.returncode == 0, job.stderr[-2000:]
    (saved,) = list(tmp_path.glob("checkpoint-*.rr"))
    step = checkpoint.read(saved)["step"]
    assert sorted(job.stdout.splitlines()[-2:]) == [f"[0]<stdout>:stopped at step {step}",
                                                    f"[1]<stdout>:stopped at step {step}"]
    assert end - 3 - 1 <= finished < end, (end, finished)  # stopped once 3 s were left, before the end


def test_each_rank_gets_its_share_of_the_cores_as_omp_num_threads_unless_set():
    """Two unbound ranks share the CPUs the job may use (before, a job inside a cgroup smaller than
    the host gave every rank all of them); a value the user set is kept."""
    job = run_job(2, "launcher/environment.py", "OMP_NUM_THREADS", timeout=60)
    assert job.returncode == 0, job.stderr[-2000:]
    allowed = len(os.sched_getaffinity(0))  # the ranks inherit this process's CPUs
    share = str(max(1, allowed // 2))
    expected = os.environ.get("OMP_NUM_THREADS", share)
    assert [json.loads(job.lines_of(r)[0])["OMP_NUM_THREADS"] for r in range(2)] == [expected, expected]
    if "OMP_NUM_THREADS" not in os.environ:  # together, no more threads than the CPUs they may use
        assert 2 * int(expected) <= allowed or expected == "1"
    job = run_job(2, "launcher/environment.py", "OMP_NUM_THREADS", env={"OMP_NUM_THREADS": "3"}, timeout=60)
    assert [json.loads(job.lines_of(r)[0])["OMP_NUM_THREADS"] for r in range(2)] == ["3", "3"]


def test_a_frozen_rank_ends_the_job_after_the_heartbeat_timeout():
    started = time.monotonic()
    job = run_job(2, "launcher/misbehave.py", "sigstop", rrun_args=("--heartbeat-seconds", "2"), timeout=60)
    assert job.returncode == 1, job.stderr[-2000:]
    assert re.fullmatch(r"rrun: rank 1 \(on .+\) sent no heartbeat for 2\.\d s \(--heartbeat-seconds 2\): its host "
                        r"is cut off or frozen", job.last_line), job.last_line
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("args, message", [
    (("--min-np", "2"), "an elastic job (--min-np, --max-np) needs --host-discovery-script"),
    (("--host-discovery-script", "true", "-H", "a:2"),
     "an elastic job takes its hosts from --host-discovery-script, not -H or --hostfile"),
    (("--host-discovery-script", "true", "-np", "2", "--restarts", "1"),
     "--restarts is for jobs that are not elastic; an elastic job goes on after failures by itself "
     "(--reset-limit caps how often)"),
    (("--host-discovery-script", "true", "--min-np", "4", "--max-np", "2"), "--max-np 2 is less than --min-np 4"),
    (("--host-discovery-script", "true"), "give --min-np (or -np) for an elastic job"),
])
def test_elastic_options_that_do_not_fit_together_are_named(args, message):
    assert one_line_error(rrun(*args, sys.executable, "-c", "pass")) == f"Error: {message}"


def test_an_elastic_job_without_enough_slots_gives_up_after_the_elastic_timeout(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:1\n")
    script.chmod(0o755)
    result = rrun("--min-np", "2", "--host-discovery-script", str(script), "--elastic-timeout", "1",
                  sys.executable, "-c", "pass")
    assert result.returncode == 2, result.stderr
    assert "rrun: waiting for hosts: 1 usable slots, --min-np is 2" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: waited 1 s (--elastic-timeout) for the 2 slots of --min-np; the hosts usable have 1")



def test_a_job_attacked_on_its_link_port_runs_to_its_end():
    """Garbage, forged and unsigned messages, a 10 MB line and a hundred silent connections on
    rrun's link while two ranks allreduce (tests/jobs/launcher/link_attack.py): before, the first
    bad line killed the link's thread (and every rank with it, for lost contact), and a silent
    connection ended the job as a rank that stopped beating."""
    job = run_job(2, "launcher/link_attack.py", rrun_args=("--heartbeat-seconds", "2"), timeout=90)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("OK after") == 2


def test_a_rank_printing_rrun_s_status_prefix_is_ordinary_output(tmp_path):
    """Such a line, not JSON, killed rrun's relay thread: mpiexec then blocked writing to the pipe
    no one drained, and the job hung. One with rrun's JSON but not its signature faked a report."""
    script = tmp_path / "forge.py"
    script.write_text("import sys\n"
                      "print('@rrun-status this is not json', flush=True)\n"
                      "sys.stderr.write('@rrun-status {\"rank\": 1, \"host\": \"x\", \"code\": 9, \"time\": 0, '\n"
                      "                 '\"stopped_by\": null, \"last_error\": \"forged\", \"left\": null}\\n')\n"
                      "for i in range(20000):\n"  # more than a pipe holds: rrun must keep draining it
                      "    print('line', i)\n")
    result = rrun("-np", "2", sys.executable, str(script), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("<stdout>:@rrun-status this is not json") == 2
    assert result.stderr.count('<stderr>:@rrun-status {"rank": 1') == 2  # output, not a report of rank 1
    assert result.stdout.count("line 19999") == 2


def test_a_line_without_end_reaches_the_terminal_in_bounded_pieces(tmp_path):
    """rrun and its wrapper read a line whole, however long: a program writing megabytes without
    a newline made them hold it all."""
    script = tmp_path / "long_line.py"
    script.write_text("import sys\nsys.stdout.write('x' * (8 << 20))\n")
    result = rrun("-np", "1", sys.executable, str(script), timeout=60)
    assert result.returncode == 0, result.stderr
    pieces = [line for line in result.stdout.splitlines() if line.startswith("[0]<stdout>:")]
    assert len(pieces) == 8 and all(len(p) <= len("[0]<stdout>:") + (1 << 20) for p in pieces)
    assert sum(len(p) - len("[0]<stdout>:") for p in pieces) == 8 << 20
