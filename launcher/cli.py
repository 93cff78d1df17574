"""rrun: start a training script on N ranks through MPI.

    rrun -np 4 python train.py
"""

import dataclasses
import fnmatch
import functools
import os
import re
import shlex
import shutil
import sys

import click
import psutil

from ringreduce import config
from ringreduce.algorithms import cost
from ringreduce.launcher import (
    checkbuild,
    dialects,
    dump,
    elastic,
    flight,
    hosts,
    link,
    protocol,
    rank,
    reach,
    slurm,
    torchrun,
)
from ringreduce.launcher.elastic import ElasticRun
from ringreduce.launcher.errors import LaunchError
from ringreduce.launcher.supervise import Supervisor
from ringreduce.planning import profiles
from ringreduce.planning.explain import explain as explain_profile

# Variables rrun gives every rank from its own environment (besides -x): ringreduce's knobs, and the
# settings the fabric, the MPI and the GPU stack read, which a job script sets on the launch node.
# Never CUDA_VISIBLE_DEVICES (the scheduler assigns GPUs per node), never a name that looks secret.
FORWARDED_PREFIXES = ("RINGREDUCE_", "NCCL_", "UCX_", "FI_", "OMPI_MCA_", "MPIR_CVAR_", "I_MPI_", "PMIX_MCA_",
                      "PSM2_", "HCOLL_")
RESTART_VARIABLE = "RINGREDUCE_RESTART_COUNT"  # 0 on the first run, then 1, 2, ... after --restarts
DEFAULT_RESET_LIMIT = 100
# Names that look like secrets (matched without case): a forwarded family's variable so named stays
# here unless -x names it. `*_KEY` is an API key's suffix; fabric settings such as NCCL_IB_PKEY pass.
SECRET_PATTERNS = ("*TOKEN*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*CREDENTIAL*", "*_KEY", "*_KEY_*", "*APIKEY*")

def _flag_type(knob):
    if knob.kind == "choice":
        return click.Choice(knob.choices)
    if knob.kind == "text":
        return click.Path(dir_okay=False)
    if knob.kind == "float" or knob.flag_unit != 1:  # a flag in larger units may be fractional
        return click.FloatRange(min=knob.minimum)
    return click.IntRange(min=int(knob.minimum))


def _as_variable(knob, value):
    """A flag's value as its variable holds it."""
    if knob.kind == "text":
        return os.path.abspath(value)
    if knob.kind == "switch":
        return "1" if value else "0"
    if knob.flag_unit != 1:
        return str(int(value * knob.flag_unit))
    return str(value)


FLAG_KNOBS = [knob for knob in config.KNOBS if knob.flag]


def knob_options(command):
    """The core's knobs as rrun's flags (ringreduce.config.KNOBS), each with its default in its help."""
    for knob in reversed(FLAG_KNOBS):
        with_default = f"{knob.help} [default: {knob.default_text}]"
        if knob.kind == "switch" and "/" not in knob.flag:  # on when given
            option = click.option(knob.flag, is_flag=True, default=None, help=knob.help)
        elif knob.kind == "switch":  # an on/off pair: unset unless one of the two is given
            option = click.option(knob.flag, default=None, help=with_default)
        else:
            option = click.option(knob.flag, type=_flag_type(knob), help=with_default)
        command = option(command)
    return command


def explanation(num_proc, host_list, hostfile, knobs):
    """What `rrun --explain` prints: the profile's parameters and the choice it makes for this job."""
    num_proc, placement = resolve_ranks(num_proc, host_list, hostfile, os.environ)
    hosts = len(placement) if placement else 1
    homogeneous = not placement or len({slots for _, slots in placement}) == 1
    path = knobs.get("profile")
    return explain_profile(profiles.load(path and os.path.abspath(path)), cost.JobShape(num_proc, hosts, homogeneous),
                           knobs.get("hierarchical_allreduce"))


def _knob_name(flag):
    return flag.split("/")[0].lstrip("-").replace("-", "_")


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.option("-np", "--num-proc", type=click.IntRange(min=1), help="Number of ranks to start.")
@click.option("-H", "--hosts", "host_list", metavar="HOST:SLOTS,...",
              help="Hosts and their slots, e.g. node1:4,node2:4.")
@click.option("--hostfile", type=click.Path(dir_okay=False),
              help="File of 'host slots=N' or 'host:N' lines.")
@click.option("-i", "--network-interface", metavar="IFACE",
              help="IP interface for MPI's TCP traffic and NCCL's bootstrap sockets (eth0, ib0 for IPoIB).")
@click.option("--net-device", metavar="HCA:PORT[,...]",
              help="RDMA devices for MPI's data (UCX_NET_DEVICES), e.g. mlx5_0:1 (see ibv_devinfo). NCCL keeps its "
                   "own choice, the HCA nearest each GPU, unless --nccl-ib-hca is given.")
@click.option("--nccl-ib-hca", metavar="HCA[:PORT][,...]",
              help="NCCL's InfiniBand devices (NCCL_IB_HCA, NCCL's syntax: mlx5_0,mlx5_1 or =mlx5_0:1 or ^mlx5_2). "
                   "Left to NCCL by default, which takes each GPU's nearest HCA.")
@click.option("--bind-to", type=click.Choice((*dialects.BIND_TO, "gpu")), default="none", show_default=True,
              help="Bind each rank to a core, a socket or a NUMA node (the same under every MPI), or (gpu) to "
                   "the CPUs near the GPU it drives, shared with the other ranks near them.")
@click.option("--map-by", type=click.Choice(dialects.MAP_BY), default="slot", show_default=True,
              help="Place consecutive ranks by slot, core, socket, NUMA node or node.")
@click.option("--report-bindings", is_flag=True, help="Each rank prints the CPUs it is bound to, before it starts.")
@click.option("--mpi-args", default="", metavar="'ARGS'", help="Extra arguments for mpiexec.")
@click.option("--launcher", type=click.Choice(["mpiexec", "srun"]), default="mpiexec", show_default=True,
              envvar="RRUN_LAUNCHER",
              help="What starts the ranks: the MPI's mpiexec, or (inside a Slurm allocation) srun with Slurm's "
                   "CPU and GPU binding and PMI (pmix for Open MPI, pmi2 otherwise; --mpi-args passes srun's own).")
@click.option("--mpiexec", "mpiexec_name", envvar="RRUN_MPIEXEC", metavar="PATH",
              help="mpiexec to use [default: from PATH, or RRUN_MPIEXEC].")
@click.option("-x", "--env", "env_items", multiple=True, metavar="NAME[=VALUE]",
              help="Set or forward an environment variable on every rank (repeatable). Values travel in "
                   "mpiexec's environment, never on a command line.")
@click.option("--secret-names", default=",".join(SECRET_PATTERNS), show_default=True, metavar="GLOB,...",
              help="Variables of the forwarded families (RINGREDUCE_, NCCL_, UCX_, ...) that are not forwarded "
                   "unless named with -x: names matching one of these patterns ('' forwards them all).")
@click.option("--verbose", is_flag=True, help="Print the mpiexec command before running it, and mpiexec's own "
              "cleanup banners after a rank failed (hidden once rrun has named the rank).")
@click.option("--dry-run", is_flag=True, help="Print the mpiexec command and exit.")
@click.option("--check-build", is_flag=True, help="Show what this installation supports and exit.")
@click.option("--monitor", is_flag=True, help="Show each rank's collectives a second, share of time spent waiting, how "
              "far behind the first rank it comes and bytes a second, over the last minute, the slowest rank "
              "marked: redrawn in place on a terminal, else a line every few seconds.")
@click.option("--dump", "dump_pid", type=int, is_flag=False, flag_value=0, default=None, metavar="[PID]",
              help="Print the last collectives of every rank of a job running here (the one of rrun PID, where "
                   "several run) and exit; the job goes on. SIGUSR2 to a running rrun prints them on its stderr.")
@click.option("--calibrate", is_flag=True,
              help="Measure the cost model's parameters on these ranks and hosts (a few seconds) and save them "
                   "(--profile) for later jobs, instead of running a command.")
@click.option("--explain", is_flag=True,
              help="Show the cost model's parameters and the algorithm it gives each collective at each size "
                   "for these ranks and hosts, and exit.")
@click.option("--strict-placement", is_flag=True,
              help="Refuse a Slurm layout that rrun would warn about (uneven ranks per node, fewer GPUs than "
                   "ranks on a node, idle GPUs) instead of running it.")
@click.option("--skip-host-check", is_flag=True,
              help="Do not check, before starting, that every host of -H/--hostfile answers over ssh.")
@click.option("--grace-seconds", type=click.FloatRange(min=0), default=3.0, show_default=True,
              help="After SIGINT or SIGTERM, how long the ranks get to finish (commit a checkpoint) before "
                   "they are killed; under Slurm keep it below KillWait (30 s by default).")
@click.option("--restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Start the job again after a failure, up to this many times "
                   "(the ranks see RINGREDUCE_RESTART_COUNT).")
@click.option("--min-np", type=click.IntRange(min=1),
              help="Elastic: go on after a failure while at least this many slots are usable [default: -np].")
@click.option("--max-np", type=click.IntRange(min=1),
              help="Elastic: grow to at most this many ranks when the discovery script reports more hosts.")
@click.option("--host-discovery-script", metavar="SCRIPT",
              help="Elastic: a program that prints the usable hosts as host:slots lines; rrun runs it again "
                   "every second, and the job resizes at its next commit when they change (docs/elastic.md).")
@click.option("--slots-per-host", type=click.IntRange(min=1),
              help="Elastic: the slots of a host the discovery script prints without a count.")
@click.option("--elastic-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="Elastic: how long to wait for --min-np slots before giving up.")
@click.option("--reset-limit", type=click.IntRange(min=0), default=DEFAULT_RESET_LIMIT, show_default=True,
              help="Elastic: give up after this many failures (a failure no host is blamed for would "
                   "otherwise start the job again for ever).")
@click.option("--blacklist-cooldown-range", type=(click.FloatRange(min=0), click.FloatRange(min=0)), default=None,
              metavar="MIN MAX", help="Elastic: a host set aside comes back after MIN seconds, doubled each "
              "further time up to MAX [default: never].")
@click.option("--tries-per-host", type=click.IntRange(min=1), default=elastic.Settings.tries_per_host,
              show_default=True,
              help="Elastic: set a host aside once its ranks failed this many times in a row with no commit in "
                   "between (a rank that fails once is started on its host again; a host that stops answering "
                   "is set aside at once).")
@click.option("--heartbeat-seconds", type=click.FloatRange(min=0.5),
              help="End the job (elastic: the generation) when a rank has sent rrun no heartbeat this long: a host "
                   f"cut off or frozen [default: {protocol.DEFAULT_HEARTBEAT_SECONDS:g} for elastic jobs, "
                   "else no heartbeat].")
@click.option("--commit-dir", metavar="DIR",
              help="Elastic: the node-local directory each host keeps the job's commits in "
                   "[default: /dev/shm/ringreduce-commits-<job>].")
@knob_options
@click.version_option(package_name="ringreduce", prog_name="rrun")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def main(num_proc, host_list, hostfile, network_interface, net_device, nccl_ib_hca, bind_to, map_by, report_bindings,
         mpi_args, launcher, mpiexec_name, env_items, secret_names, verbose, dry_run, check_build, monitor, dump_pid,
         calibrate, explain,
         strict_placement, skip_host_check, grace_seconds, restarts, min_np, max_np, host_discovery_script,
         slots_per_host, elastic_timeout, reset_limit, blacklist_cooldown_range, tries_per_host, heartbeat_seconds,
         commit_dir, command, **knobs):
    """Run COMMAND on every rank, e.g. `rrun -np 4 python train.py`.

    One rank per GPU: at init each rank takes the GPU nearest the CPUs it may run on (local rank
    mod the host's GPU count when unbound), unless CUDA_VISIBLE_DEVICES shows it one GPU or it
    chose a device itself before init.
    """
    if check_build:
        click.echo(checkbuild.report(mpiexec_name))
        return
    if dump_pid is not None:
        click.echo(dump.request(dump_pid or None))
        return
    if explain:
        click.echo(explanation(num_proc, host_list, hostfile, knobs))
        return
    command = _command(command, calibrate)
    settings, placement = None, None
    if host_discovery_script or min_np or max_np:
        settings = elastic_options(num_proc, host_list, hostfile, restarts, min_np, max_np, host_discovery_script,
                                   slots_per_host, elastic_timeout, reset_limit, blacklist_cooldown_range,
                                   heartbeat_seconds, commit_dir, tries_per_host)
    else:
        num_proc, placement = resolve_ranks(num_proc, host_list, hostfile, os.environ, strict_placement, launcher)
    if launcher == "srun":
        if settings is not None or host_list or hostfile:
            raise LaunchError("--launcher srun places the ranks as the Slurm allocation does: give no -H, "
                              "--hostfile or elastic options with it")
        dialect, mpiexec = dialects.srun_launcher(os.environ, mpiexec_name)
    else:
        mpiexec = dialects.find_mpiexec(mpiexec_name)
        dialect = dialects.dialect_of(mpiexec)
    env = {**fabric_environment(network_interface, net_device, nccl_ib_hca),
           **environment(env_items, os.environ, knobs, secret_names.split(","))}
    if report_bindings:
        env[rank.REPORT_BINDINGS_VARIABLE] = "1"
    end = slurm.job_end_time(os.environ)
    if end is not None:
        env["SLURM_JOB_END_TIME"] = str(end)
    if bind_to == "gpu":  # rrun's rank wrapper binds, from the GPUs' places; the MPI binds nothing
        env[rank.BIND_TO_GPU_VARIABLE], bind_to = "1", "none"
    env[protocol.SECRET_VARIABLE] = protocol.new_secret()  # the link's and the commits' (docs/security.md)
    if settings is None:  # an elastic job's hosts change with each generation
        env.update(torchrun.rendezvous(placement, os.environ))
    job = _job_spec(num_proc, placement, command, env, network_interface, bind_to, map_by, mpi_args)
    if settings is not None:  # each generation's placement comes from the discovery script
        in_place, _ = dialects.shrinks_in_place(mpiexec, dialect)
        launch_of = functools.partial(dialects.launch, dialect, mpiexec)
        sys.exit(ElasticRun(settings, num_proc, job, command, verbose, grace_seconds, launch_of, in_place,
                            monitor).run())
    # Inside a Slurm allocation mpiexec starts its daemons through Slurm, not ssh: no ssh check.
    from_slurm = launcher == "srun" or (placement is not None and not (host_list or hostfile))
    if placement and not (dry_run or skip_host_check or from_slurm):
        reach.check_reachable([host for host, _ in placement])
    sys.exit(_run_with_restarts(job, functools.partial(dialects.launch, dialect, mpiexec), restarts,
                                heartbeat_seconds, verbose, dry_run, grace_seconds, monitor))


def _command(command, calibrate):
    """The command every rank runs: the user's, or the calibration probe's for --calibrate."""
    if calibrate:
        if command:
            raise LaunchError("--calibrate runs its own probe: give no command with it")
        command = (sys.executable, "-m", "ringreduce.planning.calibration")
    if not command:
        raise LaunchError("give the command to run, e.g. `rrun -np 2 python train.py`")
    check_command(command)
    return command


def _job_spec(num_proc, placement, command, env, network_interface, bind_to, map_by, mpi_args):
    return dialects.JobSpec(
        num_proc=num_proc,
        rank_command=rank.wrapped(num_proc, command),
        placement=placement,
        network_interface=network_interface,
        bind_to=bind_to,
        map_by=map_by,
        env=env,
        mpi_args=shlex.split(mpi_args),
        local_cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1,  # Open MPI's slots: physical cores
        as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
    )


def _run_with_restarts(job, launch_of, restarts, heartbeat_seconds, verbose, dry_run, grace_seconds, monitor):
    """Run the job (again after a failure, up to `restarts` times), with rrun's link to the ranks
    (a heartbeat where asked) and the ranks' flight records shown where it fails; the exit status
    of its last run."""
    if dry_run:
        launch = launch_of(job)
        click.echo(shown(launch))
        return 0
    placed_on = [host for host, _ in job.placement or []]
    with link.LinkServer(heartbeat_seconds, job.env[protocol.SECRET_VARIABLE], placed_on) as link_server, \
            flight.observing(link_server, {**os.environ, **job.env}, monitor) as watch:
        for attempt in range(restarts + 1):
            env = {**job.env, RESTART_VARIABLE: str(attempt), **link_server.env(placed_on)}
            launch = launch_of(dataclasses.replace(job, env=env))
            if verbose:
                click.echo(shown(launch), err=True)
            supervisor = Supervisor(launch, verbose, grace_seconds, watch=watch)
            link_server.watch(supervisor)
            status = supervisor.run()
            if status == 0 or supervisor.interrupted_by is not None or attempt == restarts:
                return status
            click.echo(f"rrun: starting the job again ({attempt + 1} of {restarts} restarts) after it failed "
                       f"with status {status}", err=True)


def elastic_options(num_proc, host_list, hostfile, restarts, min_np, max_np, discovery_script, slots_per_host,
                    elastic_timeout, reset_limit, cooldown_range, heartbeat_seconds, commit_dir,
                    tries_per_host=elastic.Settings.tries_per_host):
    """The settings of an elastic job, checked against each other."""
    if not discovery_script:
        raise LaunchError("an elastic job (--min-np, --max-np) needs --host-discovery-script")
    if host_list or hostfile:
        raise LaunchError("an elastic job takes its hosts from --host-discovery-script, not -H or --hostfile")
    if restarts:
        raise LaunchError("--restarts is for jobs that are not elastic; an elastic job goes on after failures "
                          "by itself (--reset-limit caps how often)")
    min_np = min_np or num_proc
    if min_np is None:
        raise LaunchError("give --min-np (or -np) for an elastic job")
    if max_np is not None and max_np < min_np:
        raise LaunchError(f"--max-np {max_np} is less than --min-np {min_np}")
    if num_proc is not None and (num_proc < min_np or (max_np is not None and num_proc > max_np)):
        raise LaunchError(f"-np {num_proc} is outside --min-np {min_np} to --max-np {max_np}")
    if cooldown_range is not None and cooldown_range[0] > cooldown_range[1]:
        raise LaunchError(f"--blacklist-cooldown-range {cooldown_range[0]:g} {cooldown_range[1]:g}: MIN is above MAX")
    return elastic.Settings(min_np=min_np, max_np=max_np, discovery_script=discovery_script,
                            slots_per_host=slots_per_host, elastic_timeout=elastic_timeout, reset_limit=reset_limit,
                            cooldown_range=cooldown_range,
                            heartbeat_seconds=heartbeat_seconds or protocol.DEFAULT_HEARTBEAT_SECONDS,
                            commit_dir=commit_dir, tries_per_host=tries_per_host)


def resolve_ranks(num_proc, host_list, hostfile, environ, strict_placement=False, launcher="mpiexec"):
    """How many ranks and where: -H or --hostfile, else a Slurm allocation (its layout's problems
    said, or refused with `strict_placement`), else this host."""
    if host_list and hostfile:
        raise LaunchError("give -H or --hostfile, not both")
    given = hosts.parse_hosts(host_list) if host_list else hostfile and hosts.parse_hostfile(hostfile)
    if not given and num_proc is None:
        given = slurm.allocation(environ)
        problems = slurm.layout_warnings(environ, given or [], by_srun=launcher == "srun")
        if problems and strict_placement:
            raise LaunchError(f"--strict-placement: {problems[0]}")
        for problem in problems:
            click.echo(f"rrun: warning: {problem}", err=True)
    if not given:
        if num_proc is None:
            raise LaunchError("give the number of ranks with -np (or hosts with -H or --hostfile)")
        return num_proc, None
    num_proc = num_proc or sum(h.slots for h in given)
    return num_proc, hosts.place(given, num_proc)


def shown(launch):
    """The launch as printed (--dry-run, --verbose), as a shell would run it: the variables that
    mpiexec's environment adds, the values of secret-looking ones hidden, then its command line."""
    variables = [f"{name}={'HIDDEN' if looks_secret(name) else value}" for name, value in launch.variables.items()]
    return shlex.join([*variables, *launch.argv])


def looks_secret(name, patterns=SECRET_PATTERNS):
    return any(fnmatch.fnmatchcase(name.upper(), p.strip().upper()) for p in patterns if p.strip())


def fabric_environment(network_interface, net_device, nccl_ib_hca=None):
    """What -i, --net-device and --nccl-ib-hca mean beyond MPI's own options: NCCL's bootstrap
    sockets on the IP interface; the RDMA devices for UCX (an HCA port, never an IP interface: UCX
    given `ib0` would run TCP over IPoIB and lose RDMA); NCCL's HCAs only when named, since NCCL
    gives each GPU its nearest HCA, and one list for every rank would take that away (half or a
    quarter of its bandwidth between nodes on nodes with 4-8 HCAs)."""
    env = {"NCCL_SOCKET_IFNAME": network_interface} if network_interface else {}
    if nccl_ib_hca:
        env["NCCL_IB_HCA"] = nccl_ib_hca
    if net_device:
        ports = net_device.split(",")
        if not all(re.fullmatch(r"[A-Za-z0-9_]+:\d+", port) for port in ports):
            raise LaunchError(f"--net-device {net_device!r}: name HCA ports like mlx5_0:1 (see ibv_devinfo); "
                              "an IP interface such as ib0 would make UCX run TCP over IPoIB (use -i for that)")
        env["UCX_NET_DEVICES"] = net_device
    return env


def environment(env_items, environ, knobs=None, secret_patterns=SECRET_PATTERNS):
    """The variables every rank gets: the forwarded families from here (no name matching
    `secret_patterns`, never CUDA_VISIBLE_DEVICES), then rrun's flags, then -x NAME[=VALUE] items
    (the later win)."""
    env = {k: v for k, v in environ.items()
           if k.startswith(FORWARDED_PREFIXES) and not looks_secret(k, secret_patterns)}
    for knob in FLAG_KNOBS:
        value = (knobs or {}).get(_knob_name(knob.flag))
        if value is not None:
            env[knob.variable] = _as_variable(knob, value)
    for item in env_items:
        name, has_value, value = item.partition("=")
        if not name.isidentifier():
            raise LaunchError(f"-x {item!r}: {name!r} is not a variable name")
        if not has_value:
            if name not in environ:
                raise LaunchError(f"-x {name}: the variable is not set here, so there is nothing to forward")
            value = environ[name]
        env[name] = value
    return env


# Python options that take the next argument as their value.
_PYTHON_VALUE_OPTIONS = {"-W", "-X", "--check-hash-based-pycs"}


def check_command(command):
    """Catch a missing program or script here, with one line, instead of once per rank."""
    program = command[0]
    if shutil.which(program) is None:
        raise LaunchError(f"command not found: {program}")
    if os.path.basename(program).startswith("python"):
        script = python_script(command[1:])
        if script is not None and not os.path.exists(script):
            raise LaunchError(f"script not found: {script}")


def python_script(arguments):
    """The script a python command line runs, or None (-m, -c, or an interactive python)."""
    words = iter(arguments)
    for word in words:
        if word.startswith(("-m", "-c")):
            return None
        if word in _PYTHON_VALUE_OPTIONS:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None
