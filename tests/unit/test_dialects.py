"""The mpiexec command line each dialect builds for each rrun option, and the variables that
travel in mpiexec's environment instead (no MPI is started)."""

import os

import pytest

from ringreduce.launcher.dialects import (
    CARRIED_VARIABLES,
    ENVIRONMENT_END,
    MPICH,
    IntelMPI,
    JobSpec,
    OpenMPI,
    Srun,
    detect,
    launch,
    srun_launcher,
)
from ringreduce.launcher.errors import LaunchError

RANK = ["python", "-m", "ringreduce.launcher.rank", "4", "--", "python", "train.py"]


def job(**changes):
    return JobSpec(**{"num_proc": 4, "rank_command": RANK, "local_cores": 8, **changes})


@pytest.mark.parametrize("text, dialect", [
    ("mpiexec (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/", OpenMPI),
    ("mpirun (Open MPI) 5.0.3", OpenMPI),
    ("HYDRA build details:\n    Version: 5.0.2", MPICH),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619", IntelMPI),
])
def test_dialect_is_read_off_the_version_text(text, dialect):
    assert type(detect(text)) is dialect


def test_unknown_mpi_is_not_guessed():
    assert detect("some other launcher 1.0") is None


def test_open_mpi_local_run():
    assert OpenMPI().command("mpiexec", job()) == [
        "mpiexec", "-np", "4", "--bind-to", "none", "--map-by", "slot", "--mca", "osc", "^ucx", *_carried("-x"), *RANK]


def test_open_mpi_oversubscribes_only_past_the_local_cores():
    assert "--oversubscribe" in OpenMPI().command("mpiexec", job(local_cores=2))
    assert "--oversubscribe" not in OpenMPI().command("mpiexec", job(local_cores=4))
    placed = job(local_cores=2, placement=[("a", 2), ("b", 2)])
    assert "--oversubscribe" not in OpenMPI().command("mpiexec", placed)


def test_open_mpi_as_root_hosts_interface_env_and_extra_args():
    argv = OpenMPI().command("mpiexec", job(
        as_root=True, placement=[("a", 2), ("b", 2)], network_interface="ib0",
        env={"RINGREDUCE_ALGORITHM": "mpi", "FOO": "bar baz"}, mpi_args=["--mca", "pml", "ucx"]))
    assert "--allow-run-as-root" in argv
    assert argv[argv.index("-H") + 1] == "a:2,b:2"
    assert _pairs(argv, "--mca") == [("btl_tcp_if_include", "ib0"), ("oob_tcp_if_include", "ib0"),
                                     ("osc", "^ucx"), ("pml", "ucx")]
    assert ["-x", "RINGREDUCE_ALGORITHM"] in _windows(argv) and ["-x", "FOO"] in _windows(argv)
    assert argv[-len(RANK) - 3:] == ["--mca", "pml", "ucx", *RANK]


def test_open_mpi_leaves_a_chosen_osc_alone():
    for chosen in (job(mpi_args=["--mca", "osc", "ucx"]), job(env={"OMPI_MCA_osc": "ucx"})):
        assert ("osc", "^ucx") not in _pairs(OpenMPI().command("mpiexec", chosen), "--mca")


def test_mpich_command():
    argv = MPICH().command("/opt/mpich/bin/mpiexec", job(
        placement=[("a", 3), ("b", 1)], network_interface="eth1", env={"FOO": "1"}, mpi_args=["-ppn", "3"]))
    # Across hosts Hydra passes on only what rrun names: the carried variables, then the job's.
    assert argv == ["/opt/mpich/bin/mpiexec", "-n", "4", "-hosts", "a:3,b:1", "-iface", "eth1", "-genvlist",
                    ",".join([*_carried(), "FOO"]), "-ppn", "3", *RANK]


def test_mpich_local_run_is_minimal():
    assert MPICH().command("mpiexec", job()) == ["mpiexec", "-n", "4", *RANK]


def test_intel_mpi_puts_each_host_in_its_own_section():
    argv = IntelMPI().command("mpiexec", job(placement=[("a", 3), ("b", 1)], env={"FOO": "1"}))
    # Intel MPI pins by default; rrun's default binding is none under every MPI.
    assert argv == ["mpiexec", "-genvlist", ",".join([*_carried(), "I_MPI_PIN", "FOO"]),
                    "-n", "3", "-host", "a", *RANK, ":", "-n", "1", "-host", "b", *RANK]


@pytest.mark.parametrize("dialect, bind_to, map_by, expected, variables", [
    (OpenMPI(), "core", "socket", ["--bind-to", "core", "--map-by", "package"], {}),
    (OpenMPI(), "numa", "node", ["--bind-to", "numa", "--map-by", "node"], {}),
    (MPICH(), "core", "socket", ["-bind-to", "core", "-map-by", "socket"], {}),
    (MPICH(), "none", "slot", [], {}),
    (IntelMPI(), "core", "socket", ["-genvlist", "I_MPI_PIN,I_MPI_PIN_DOMAIN,I_MPI_PIN_ORDER"],
     {"I_MPI_PIN": "1", "I_MPI_PIN_DOMAIN": "core", "I_MPI_PIN_ORDER": "scatter"}),
    (IntelMPI(), "numa", "node", ["-rr", "-genvlist", "I_MPI_PIN,I_MPI_PIN_DOMAIN"],
     {"I_MPI_PIN": "1", "I_MPI_PIN_DOMAIN": "numa"}),
])
def test_binding_and_mapping_mean_the_same_under_every_mpi(dialect, bind_to, map_by, expected, variables):
    started = launch(dialect, "mpiexec", job(bind_to=bind_to, map_by=map_by))
    assert started.argv[3:3 + len(expected)] == expected, started.argv
    assert {k: v for k, v in started.variables.items() if k not in CARRIED_VARIABLES} == variables


@pytest.mark.parametrize("dialect", [OpenMPI(), MPICH(), IntelMPI()], ids=["openmpi", "mpich", "intel"])
@pytest.mark.parametrize("placement", [None, [("a", 2), ("b", 2)]], ids=["one-host", "two-hosts"])
def test_values_never_sit_on_mpiexec_s_command_line(dialect, placement):
    """`rrun -x WANDB_API_KEY=...` and the job's own secret: their values were in mpiexec's argv
    (anyone's to read in /proc/PID/cmdline); now they travel in its environment."""
    values = {"WANDB_API_KEY": "wandb-0123456789", "RINGREDUCE_JOB_SECRET": "f00d" * 16, "HF_TOKEN": "hf_abc"}
    started = launch(dialect, "mpiexec", job(placement=placement, env=values))
    assert not [word for word in started.argv if any(value in word for value in values.values())]
    assert {name: started.variables[name] for name in values} == values


def test_binding_given_in_mpi_args_is_not_given_twice():
    argv = OpenMPI().command("mpiexec", job(bind_to="core", mpi_args=["--bind-to", "socket", "--map-by=ppr:1:node"]))
    assert argv.count("--bind-to") == 1 and "--map-by" not in argv and argv[-len(RANK) - 3] == "--bind-to"
    assert MPICH().command("mpiexec", job(bind_to="core", mpi_args=["-bind-to", "socket"])).count("-bind-to") == 1


def _carried(flag=None):
    """The carried variables' names, each after `flag` where given (Open MPI's -x NAME)."""
    names = [name for name in CARRIED_VARIABLES if name in os.environ]
    return [w for name in names for w in (flag, name)] if flag else names


def _windows(argv):
    return [argv[i:i + 2] for i in range(len(argv) - 1)]


def _pairs(argv, flag):
    return [(argv[i + 1], argv[i + 2]) for i, word in enumerate(argv) if word == flag]


def test_mpiexec_s_environment_ends_with_a_variable_no_rank_needs():
    """Hydra drops the last variable of its environment from -genvlist: on other hosts the job's
    commit directory (the last variable rrun added) was missing, and each host's commits with it."""
    started = launch(MPICH(), "mpiexec", job(placement=[("a", 1), ("b", 1)], env={"RINGREDUCE_COMMIT_DIR": "/c"}))
    base = {ENVIRONMENT_END: "0", "HOME": "/root"}
    environment = started.environment(base)
    assert list(environment)[-1] == ENVIRONMENT_END and environment[ENVIRONMENT_END] == "1"
    assert environment["RINGREDUCE_COMMIT_DIR"] == "/c" and environment["HOME"] == "/root"
    assert ENVIRONMENT_END not in started.argv[started.argv.index("-genvlist") + 1].split(",")


@pytest.mark.parametrize("version_text, socket_word", [
    ("mpirun (Open MPI) 4.1.5\n\nReport bugs to https://www.open-mpi.org/community/help/", "socket"),
    ("mpirun (Open MPI) 5.0.8\n\nReport bugs to https://www.open-mpi.org/community/help/", "package"),
])
def test_open_mpi_s_binding_words_follow_its_version(version_text, socket_word):
    """Open MPI 4's mpirun knows `socket`, not `package` (5's word for it)."""
    argv = detect(version_text).command("mpiexec", job(bind_to="socket", map_by="socket"))
    assert argv[3:7] == ["--bind-to", socket_word, "--map-by", socket_word], argv


def test_intel_mpi_starts_its_daemons_through_slurm_inside_an_allocation(monkeypatch):
    monkeypatch.delenv("I_MPI_HYDRA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert "I_MPI_HYDRA_BOOTSTRAP" not in launch(IntelMPI(), "mpiexec", job()).variables
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert launch(IntelMPI(), "mpiexec", job()).variables["I_MPI_HYDRA_BOOTSTRAP"] == "slurm"
    monkeypatch.setenv("I_MPI_HYDRA_BOOTSTRAP", "ssh")  # the user's choice stands
    assert "I_MPI_HYDRA_BOOTSTRAP" not in launch(IntelMPI(), "mpiexec", job()).variables


def test_intel_mpi_keeps_the_job_script_s_own_pinning(monkeypatch):
    """rrun's default I_MPI_PIN=0 silently cancelled a script's I_MPI_PIN_DOMAIN."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    for name in [n for n in os.environ if n.startswith("I_MPI_PIN")]:
        monkeypatch.delenv(name)
    assert launch(IntelMPI(), "mpiexec", job()).variables["I_MPI_PIN"] == "0"
    monkeypatch.setenv("I_MPI_PIN_DOMAIN", "socket")
    assert "I_MPI_PIN" not in launch(IntelMPI(), "mpiexec", job()).variables
    monkeypatch.delenv("I_MPI_PIN_DOMAIN")
    assert "I_MPI_PIN" not in launch(IntelMPI(), "mpiexec", job(env={"I_MPI_PIN_PROCESSOR_LIST": "0-3"})).variables


def test_srun_as_the_launcher_starts_the_wrapper_with_slurm_s_pmi_and_binding():
    assert Srun("pmi2").command("srun", job()) == ["srun", "--ntasks", "4", "--kill-on-bad-exit=1", "--mpi=pmi2",
                                                   *RANK]
    argv = Srun("pmix").command("srun", job(bind_to="numa", map_by="node"))
    assert argv[3:7] == ["--kill-on-bad-exit=1", "--mpi=pmix", "--cpu-bind=ldoms", "--distribution=cyclic"], argv
    given = Srun().command("srun", job(bind_to="core", mpi_args=["--mpi=pmi2", "--cpu-bind=map_cpu:0,2"]))
    assert given.count("--mpi=pmi2") == 1 and not [a for a in given if a.startswith("--cpu-bind=cores")]
    values = {"RINGREDUCE_JOB_SECRET": "f00d" * 16}
    started = launch(Srun(), "srun", job(env=values))
    assert started.variables == values and not [a for a in started.argv if "f00d" in a]


def test_pmix_clients_under_srun_ask_for_the_security_every_pmix_has(monkeypatch):
    """Slurm offers "munge,native"; Open MPI's wheel has no munge and said so on every rank."""
    monkeypatch.delenv("PMIX_MCA_psec", raising=False)
    assert launch(Srun("pmix"), "srun", job()).variables == {"PMIX_MCA_psec": "native"}
    assert launch(Srun("pmix"), "srun", job(env={"PMIX_MCA_psec": "munge"})).variables == {"PMIX_MCA_psec": "munge"}
    assert launch(Srun("pmi2"), "srun", job()).variables == {}
    monkeypatch.setenv("PMIX_MCA_psec", "munge")
    assert launch(Srun("pmix"), "srun", job()).variables == {}


def test_srun_as_the_launcher_needs_an_allocation():
    with pytest.raises(LaunchError, match=r"--launcher srun runs inside a Slurm allocation"):
        srun_launcher({})
