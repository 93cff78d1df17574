"""Before MPI starts: can every other host be reached over ssh, as the MPI launcher will try?

An unreachable host otherwise shows up as an mpiexec that hangs or fails with a message about
its own daemons. Here each one is tried at once, in parallel, with a timeout, and the error
names every host that did not answer and what ssh said.
"""

import concurrent.futures
import socket
import subprocess

from ringreduce.launcher.errors import LaunchError

CONNECT_SECONDS = 5


def this_host_names():
    name = socket.gethostname()
    return {"localhost", "127.0.0.1", "::1", name, name.split(".")[0]}


def check_reachable(hosts, ssh="ssh"):
    """Raise LaunchError naming the hosts (other than this one) that `ssh host true` cannot reach."""
    remote = sorted(set(hosts) - this_host_names())
    if not remote:
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(remote))) as pool:
        problems = {host: problem for host, problem in zip(remote, pool.map(lambda h: _try(ssh, h), remote),
                                                          strict=True) if problem}
    if problems:
        listing = "; ".join(f"{host}: {problem}" for host, problem in problems.items())
        raise LaunchError(f"cannot reach {len(problems)} of the hosts over ssh ({listing}). Check the host "
                          "names, that ssh to them works without a password, or pass --skip-host-check "
                          "if your MPI starts its ranks another way")


def _try(ssh, host):
    """None when `ssh host true` works, else what went wrong, in one line."""
    command = [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_SECONDS}", host, "true"]
    try:
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=3 * CONNECT_SECONDS)
    except FileNotFoundError:
        return f"no {ssh} command here"
    except subprocess.TimeoutExpired:
        return f"no answer within {3 * CONNECT_SECONDS} s"
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else f"ssh exited with status {result.returncode}"
