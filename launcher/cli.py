"""rrun: start a training script on N ranks through MPI.

    rrun -np 4 python train.py
"""

import os
import shlex
import shutil
import sys

import click
import psutil

from ringreduce.launcher import checkbuild, dialects, hosts, slurm
from ringreduce.launcher.errors import LaunchError
from ringreduce.launcher.supervise import Supervisor

FORWARDED_PREFIXES = ("RINGREDUCE_",)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.option("-np", "--num-proc", type=click.IntRange(min=1), help="Number of ranks to start.")
@click.option("-H", "--hosts", "host_list", metavar="HOST:SLOTS,...",
              help="Hosts and their slots, e.g. node1:4,node2:4.")
@click.option("--hostfile", type=click.Path(dir_okay=False),
              help="File of 'host slots=N' or 'host:N' lines.")
@click.option("-i", "--network-interface", metavar="IFACE", help="Network interface MPI should use.")
@click.option("--mpi-args", default="", metavar="'ARGS'", help="Extra arguments for mpiexec.")
@click.option("--mpiexec", "mpiexec_name", envvar="RRUN_MPIEXEC", metavar="PATH",
              help="mpiexec to use [default: from PATH, or RRUN_MPIEXEC].")
@click.option("-x", "--env", "env_items", multiple=True, metavar="NAME[=VALUE]",
              help="Set or forward an environment variable on every rank (repeatable).")
@click.option("--verbose", is_flag=True, help="Print the mpiexec command before running it.")
@click.option("--dry-run", is_flag=True, help="Print the mpiexec command and exit.")
@click.option("--check-build", is_flag=True, help="Show what this installation supports and exit.")
@click.version_option(package_name="ringreduce", prog_name="rrun")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def main(num_proc, host_list, hostfile, network_interface, mpi_args, mpiexec_name, env_items,
         verbose, dry_run, check_build, command):
    """Run COMMAND on every rank, e.g. `rrun -np 4 python train.py`."""
    if check_build:
        click.echo(checkbuild.report(mpiexec_name))
        return
    if not command:
        raise LaunchError("give the command to run, e.g. `rrun -np 2 python train.py`")
    check_command(command)
    num_proc, placement = resolve_ranks(num_proc, host_list, hostfile, os.environ)
    mpiexec = dialects.find_mpiexec(mpiexec_name)
    job = dialects.JobSpec(
        num_proc=num_proc,
        rank_command=[sys.executable, "-m", "ringreduce.launcher.rank", str(num_proc), "--", *command],
        placement=placement,
        network_interface=network_interface,
        env=environment(env_items, os.environ),
        mpi_args=shlex.split(mpi_args),
        local_cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
    )
    argv = dialects.dialect_of(mpiexec).command(mpiexec, job)
    if verbose or dry_run:
        click.echo(shlex.join(argv), err=not dry_run)
    if dry_run:
        return
    sys.exit(Supervisor(argv).run())


def resolve_ranks(num_proc, host_list, hostfile, environ):
    """How many ranks and where: -H or --hostfile, else a Slurm allocation, else this host."""
    if host_list and hostfile:
        raise LaunchError("give -H or --hostfile, not both")
    given = hosts.parse_hosts(host_list) if host_list else hostfile and hosts.parse_hostfile(hostfile)
    if not given and num_proc is None:
        given = slurm.allocation(environ)
    if not given:
        if num_proc is None:
            raise LaunchError("give the number of ranks with -np (or hosts with -H or --hostfile)")
        return num_proc, None
    num_proc = num_proc or sum(h.slots for h in given)
    return num_proc, hosts.place(given, num_proc)


def environment(env_items, environ):
    """The variables every rank gets: ringreduce's knobs, then -x NAME[=VALUE] items."""
    env = {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIXES)}
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
