"""What each MPI's mpiexec calls the same things: hosts, environment, network interface, binding.

The dialect is read off `mpiexec --version`. Each builds an argument list (never a shell
string) from one JobSpec, and the variables the ranks get: mpiexec's command line names them,
their values travel in mpiexec's own environment (a command line is anyone's to read in `ps`).
"""

import dataclasses
import os
import re
import shutil
import subprocess
import sys

from ringreduce.launcher.errors import LaunchError

# rrun's binding and mapping choices, which mean the same under every MPI. "none" is the default
# everywhere: Open MPI binds by default and Intel MPI pins by default, so rrun turns both off
# unless asked; MPICH's Hydra binds nothing by default.
BIND_TO = ("none", "core", "socket", "numa")
MAP_BY = ("slot", "core", "socket", "numa", "node")


@dataclasses.dataclass(frozen=True)
class JobSpec:
    num_proc: int
    rank_command: list  # what every rank runs (rrun's per-rank wrapper around the user's command)
    placement: list | None = None  # [(host, ranks)], or None: all on this host
    network_interface: str | None = None
    bind_to: str = "none"
    map_by: str = "slot"
    env: dict = dataclasses.field(default_factory=dict)  # variables to set on every rank
    mpi_args: list = dataclasses.field(default_factory=list)
    local_cores: int = 1
    as_root: bool = False
    fault_tolerant: bool = False  # the survivors of a failed rank go on (ULFM; Open MPI only)


# What ranks on other hosts get of rrun's environment, besides RINGREDUCE_* and -x: what finds
# the same Python and libraries there. Nothing else leaves this host unless asked for.
CARRIED_VARIABLES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")


def carried(job):
    return {name: os.environ[name] for name in CARRIED_VARIABLES if name in os.environ}


# Hydra (MPICH 5.0.2 at least) never forwards the last variable of its own environment to other
# hosts, even when -genvlist names it: mpiexec's environment ends with this one, which no rank needs.
ENVIRONMENT_END = "RRUN_ENVIRONMENT_END"


@dataclasses.dataclass(frozen=True)
class Launch:
    """How to start a job: mpiexec's command line, and what its environment adds to rrun's."""
    argv: list
    variables: dict

    def environment(self, base: dict | None = None) -> dict:
        """mpiexec's environment: `base` (rrun's own) with the job's variables, ENVIRONMENT_END last."""
        env = {name: value for name, value in (os.environ if base is None else base).items()
               if name != ENVIRONMENT_END}
        return {**env, **self.variables, ENVIRONMENT_END: "1"}


def launch(dialect, mpiexec: str, job: JobSpec) -> Launch:
    return Launch(dialect.command(mpiexec, job), dialect.variables(job))


def _passes(job, *options):
    """Has the user given one of these options in --mpi-args? (Then rrun does not give it too.)"""
    return any(word.split("=", 1)[0] in options for word in job.mpi_args)


class OpenMPI:
    name = "Open MPI"

    def __init__(self, major: int = 5) -> None:
        # Open MPI 5's mpirun calls a socket a package; 4's knows only `socket`.
        self._NAMES = {"socket": "package"} if major >= 5 else {}

    def command(self, mpiexec, job):
        args = [mpiexec, "-np", str(job.num_proc)]
        if not _passes(job, "--bind-to", "-bind-to"):
            args += ["--bind-to", self._NAMES.get(job.bind_to, job.bind_to)]
        if not _passes(job, "--map-by", "-map-by"):
            args += ["--map-by", self._NAMES.get(job.map_by, job.map_by)]
        if job.as_root:
            args.append("--allow-run-as-root")
        if job.fault_tolerant:  # ULFM; the ranks run without rrun's wrapper, and Open MPI tags their lines
            args += ["--with-ft", "ulfm", "--output", "tag"]
        if job.placement:
            args += ["-H", ",".join(f"{host}:{count}" for host, count in job.placement)]
        elif job.num_proc > job.local_cores:
            args.append("--oversubscribe")
        if job.network_interface:
            for key in ("btl_tcp_if_include", "oob_tcp_if_include"):
                args += ["--mca", key, job.network_interface]
        if not self._sets_osc(job):
            # ringreduce's shared windows come from osc/sm; osc/ucx, where UCX offers no RMA
            # transport (TCP-only hosts, containers), prints a spurious error on every rank.
            args += ["--mca", "osc", "^ucx"]
        for name in self.variables(job):  # Open MPI carries nothing by itself; -x NAME takes mpiexec's value
            args += ["-x", name]
        return args + job.mpi_args + job.rank_command

    @staticmethod
    def variables(job):
        return {**carried(job), **job.env}

    @staticmethod
    def _sets_osc(job):
        """Has the user chosen the one-sided components (in --mpi-args, -x or the environment)?"""
        pairs = zip(job.mpi_args, job.mpi_args[1:], strict=False)
        passed = any(flag in ("--mca", "-mca") and key == "osc" for flag, key in pairs)
        return passed or "OMPI_MCA_osc" in job.env or "OMPI_MCA_osc" in os.environ


class MPICH:
    name = "MPICH"

    def command(self, mpiexec, job):
        args = [mpiexec, "-n", str(job.num_proc)]
        if job.placement:
            args += ["-hosts", ",".join(f"{host}:{count}" for host, count in job.placement)]
        if job.bind_to != "none" and not _passes(job, "-bind-to", "--bind-to"):
            args += ["-bind-to", job.bind_to]
        if job.map_by != "slot" and not _passes(job, "-map-by", "--map-by"):
            args += ["-map-by", job.map_by]
        args += self._common(job)
        return args + job.mpi_args + job.rank_command

    @classmethod
    def _common(cls, job):
        """Hydra gives ranks on this host all of mpiexec's environment, and ranks on other hosts
        only what -genvlist names (by default it would give them all of it too)."""
        args = ["-iface", job.network_interface] if job.network_interface else []
        names = list(cls.variables(job))
        return args + (["-genvlist", ",".join(names)] if names else [])

    @classmethod
    def variables(cls, job):
        return {**(carried(job) if job.placement else {}), **cls._pinning(job), **job.env}

    @staticmethod
    def _pinning(job):
        return {}


class IntelMPI(MPICH):
    """Hydra-based like MPICH, but it pins through its own variables (and by default, which rrun
    turns off unless asked); per-host rank counts go in one section per host."""

    name = "Intel MPI"
    _ORDER = {"core": "compact", "socket": "scatter", "numa": "scatter"}

    def command(self, mpiexec, job):
        order = ["-rr"] if job.map_by == "node" else []
        if not job.placement:
            return [mpiexec, "-n", str(job.num_proc), *order, *self._common(job), *job.mpi_args, *job.rank_command]
        args = [mpiexec, *order] + self._common(job) + job.mpi_args
        for index, (host, count) in enumerate(job.placement):
            args += ([":"] if index else []) + ["-n", str(count), "-host", host] + job.rank_command
        return args


    @classmethod
    def variables(cls, job):
        """Inside a Slurm allocation Hydra must start its daemons through Slurm (its default, ssh,
        is refused on most compute nodes), unless the user chose a bootstrap."""
        bootstrap = {}
        if os.environ.get("SLURM_JOB_ID") and "I_MPI_HYDRA_BOOTSTRAP" not in {**os.environ, **job.env}:
            bootstrap = {"I_MPI_HYDRA_BOOTSTRAP": "slurm"}
        return {**bootstrap, **super().variables(job)}

    @classmethod
    def _pinning(cls, job):
        if job.bind_to == "none":
            # Intel MPI pins by default, which rrun turns off, unless the user pins by its variables.
            chosen = any(name.startswith("I_MPI_PIN") for name in {**os.environ, **job.env})
            return {} if chosen else {"I_MPI_PIN": "0"}
        pinning = {"I_MPI_PIN": "1", "I_MPI_PIN_DOMAIN": job.bind_to}
        if job.map_by in cls._ORDER:
            pinning["I_MPI_PIN_ORDER"] = cls._ORDER[job.map_by]
        return pinning


class Srun:
    """Slurm's srun as the launcher (`rrun --launcher srun`), where a site or a container wants srun
    to start the tasks: it starts rrun's per-rank wrapper with Slurm's own CPU and GPU binding and
    its PMI, so the ranks keep rrun's tagged output, the failing rank named, the link and torchrun's
    variables. srun gives the tasks its whole environment (Slurm's default), where the job's
    variables are; nothing goes on its command line but their absence."""

    name = "srun"
    _CPU_BIND = {"core": "cores", "socket": "sockets", "numa": "ldoms"}

    def __init__(self, pmi: str = "pmi2") -> None:
        self.pmi = pmi  # pmix for Open MPI, pmi2 for MPICH and Intel MPI

    def command(self, srun, job):
        args = [srun, "--ntasks", str(job.num_proc), "--kill-on-bad-exit=1"]
        if not _passes(job, "--mpi"):
            args.append(f"--mpi={self.pmi}")
        if job.bind_to in self._CPU_BIND and not _passes(job, "--cpu-bind", "--cpu_bind"):
            args.append(f"--cpu-bind={self._CPU_BIND[job.bind_to]}")  # else Slurm's own binding stands
        if job.map_by == "node" and not _passes(job, "--distribution", "-m"):
            args.append("--distribution=cyclic")
        return args + job.mpi_args + job.rank_command

    def variables(self, job):
        if self.pmi != "pmix" or "PMIX_MCA_psec" in job.env or "PMIX_MCA_psec" in os.environ:
            return dict(job.env)
        # Slurm offers its PMIx clients "munge,native"; a PMIx built without munge (Open MPI's
        # wheel) prints a help banner per rank for the one it lacks. Every PMIx has native.
        return {"PMIX_MCA_psec": "native", **job.env}


def srun_launcher(environ, mpiexec_named=None):
    """(the Srun dialect, srun's path) for `--launcher srun`: inside a Slurm allocation only, with
    the PMI of the MPI beside this Python (Open MPI: pmix; MPICH, Intel MPI or none found: pmi2)."""
    if not environ.get("SLURM_JOB_ID"):
        raise LaunchError("--launcher srun runs inside a Slurm allocation (a batch script, or salloc)")
    srun = shutil.which("srun")
    if srun is None:
        raise LaunchError("--launcher srun: no srun on PATH (load the site's Slurm module)")
    try:
        dialect = dialect_of(find_mpiexec(mpiexec_named))
    except LaunchError:
        dialect = None
    return Srun("pmix" if isinstance(dialect, OpenMPI) else "pmi2"), srun


def detect(version_text):
    """The dialect that printed this `mpiexec --version`, or None."""
    if "Intel(R) MPI" in version_text:
        return IntelMPI()
    if "Open MPI" in version_text or "OpenRTE" in version_text or "PRRTE" in version_text:
        version = re.search(r"\(Open MPI\) (\d+)\.", version_text) or re.search(r"Open MPI v?(\d+)\.", version_text)
        return OpenMPI(int(version[1]) if version else 5)
    if "HYDRA" in version_text or "MPICH" in version_text:
        return MPICH()
    return None


def find_mpiexec(named=None):
    """The mpiexec to use: the one named, else the one beside this Python (where `pip install
    mpich` or a conda MPI puts it, matching the MPI that this environment's mpi4py loads, even
    when the environment is not on PATH), else the one on PATH."""
    if named:
        path = shutil.which(named)
        if path is None:
            raise LaunchError(f"mpiexec {named!r} (from --mpiexec or RRUN_MPIEXEC) does not exist")
        return path
    beside_python = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    path = shutil.which(beside_python) or shutil.which("mpiexec")
    if path is None:
        raise LaunchError(
            "no mpiexec found beside Python or on PATH: install one with `pip install ringreduce[mpich]` "
            "(or the site's MPI), or name it with --mpiexec / RRUN_MPIEXEC"
        )
    return path


def dialect_of(mpiexec):
    try:
        result = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LaunchError(f"could not run {mpiexec} --version: {error}") from None
    text = result.stdout + result.stderr
    dialect = detect(text)
    if dialect is None:
        first = text.strip().splitlines()[0] if text.strip() else "(no output)"
        raise LaunchError(
            f"{mpiexec} is not an MPI that rrun knows (its --version says: {first}); "
            "rrun speaks Open MPI, MPICH and Intel MPI"
        )
    return dialect


def shrinks_in_place(mpiexec, dialect):
    """(whether this MPI lets the survivors of a failed rank go on in place (ULFM), why not): the
    one place rrun decides it, for elastic jobs and --check-build alike. Open MPI built with it
    (`ompi_info` beside mpiexec says ft_mpi_support:yes; 5.0's wheel is) does, under `--with-ft
    ulfm`, and reports a dead peer in half a second. MPICH's calls exist, but its 5.0.2 wheel hung
    on a dead peer here, or failed an assertion at init with MPIR_CVAR_ENABLE_FT=1 (docs/elastic.md)."""
    if dialect.name != "Open MPI":
        return False, f"{dialect.name}'s fault tolerance did not work here (a dead peer hangs the others)"
    info = os.path.join(os.path.dirname(mpiexec), "ompi_info")
    try:
        result = subprocess.run([info, "--parsable"], capture_output=True, text=True, timeout=30,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"{info} could not be asked ({error})"
    if "options:ft_mpi_support:yes" in result.stdout.splitlines():
        return True, ""
    return False, "this Open MPI is built without it (ompi_info: ft_mpi_support is not yes)"
