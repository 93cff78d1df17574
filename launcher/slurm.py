"""Reading a Slurm allocation: how many tasks, on which nodes. A value rrun cannot read is a
LaunchError that names the variable and the part it could not read."""

import re
import shutil
import subprocess
import time

from ringreduce.launcher.errors import LaunchError
from ringreduce.launcher.hosts import Host

# More nodes or tasks than any cluster has: what the environment says beyond is refused before it
# is expanded in memory (`node[0-999999999]`, `1(x1000000000)`).
MAX_EXPANDED = 100_000


def allocation(environ):
    """The allocation's hosts and slots, or None outside Slurm. What rrun cannot place one rank
    per task in (a heterogeneous job, rrun as a task of an srun step) is a LaunchError that says
    what to change."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    tasks = environ.get("SLURM_TASKS_PER_NODE")
    if not environ.get("SLURM_JOB_ID") or not nodelist or not tasks:
        return None
    if environ.get("SLURM_HET_SIZE"):
        raise LaunchError(f"this is a heterogeneous Slurm job (SLURM_HET_SIZE={environ['SLURM_HET_SIZE']}), whose "
                          "components rrun cannot tell apart: submit one homogeneous job, or give the hosts "
                          "with -H or --hostfile")
    if environ.get("SLURM_STEP_ID") is not None:
        step_tasks = environ.get("SLURM_STEP_NUM_TASKS", "?")
        raise LaunchError(f"rrun runs inside an srun step (SLURM_STEP_ID={environ['SLURM_STEP_ID']}, "
                          f"{step_tasks} task(s)), whose task counts (SLURM_TASKS_PER_NODE={tasks!r}) are the "
                          f"step's, not the job's: run rrun in the batch script itself, without srun (it starts "
                          f"the ranks on every node of the job), or give the hosts with -H or --hostfile")
    names = expand_nodelist(nodelist)
    counts = expand_tasks_per_node(tasks)
    if len(counts) != len(names):
        raise LaunchError(f"the Slurm allocation names {len(names)} nodes (SLURM_JOB_NODELIST={nodelist!r}) but "
                          f"{len(counts)} task counts (SLURM_TASKS_PER_NODE={tasks!r})")
    return [Host(name, count) for name, count in zip(names, counts, strict=True)]


def layout_warnings(environ, hosts, by_srun=False):
    """What in the allocation's layout makes a GPU job slow or leaves GPUs idle, one line each
    (rrun prints them; --strict-placement refuses the job instead). `by_srun`: srun starts the
    ranks (rrun --launcher srun), each task with its own GPUs."""
    warnings = []
    per_task = environ.get("SLURM_GPUS_PER_TASK", "")
    if per_task and not by_srun:
        warnings.append(f"--gpus-per-task={per_task}: the step in which mpiexec starts its daemons has one task "
                        f"per node, so it sees {per_task} GPU(s) per node and every rank of a node shares them; "
                        f"ask --gpus-per-node instead (or use rrun --launcher srun)")
    counts = sorted({host.slots for host in hosts})
    if len(counts) > 1:
        warnings.append(f"the nodes run different numbers of ranks ({', '.join(map(str, counts))}; "
                        f"SLURM_TASKS_PER_NODE={environ['SLURM_TASKS_PER_NODE']}): each node's ranks share its "
                        f"GPUs and links unevenly, and the slowest node sets the pace; ask for --ntasks-per-node")
    gpus = environ.get("SLURM_GPUS_ON_NODE", "")
    if gpus.isdigit() and hosts:
        here = int(gpus)
        fewest, most = min(h.slots for h in hosts), max(h.slots for h in hosts)
        if most > here:
            warnings.append(f"up to {most} ranks per node but {here} GPU(s) visible on this node "
                            f"(SLURM_GPUS_ON_NODE={here}): ranks will share GPUs, and NCCL refuses two ranks on "
                            f"one GPU; with --gpus-per-task the step mpiexec starts sees fewer GPUs, so ask "
                            f"--gpus-per-node={most} instead")
        elif fewest < here:
            warnings.append(f"{fewest} rank(s) on a node with {here} GPUs leaves {here - fewest} of them idle "
                            f"(SLURM_TASKS_PER_NODE={environ['SLURM_TASKS_PER_NODE']}): ask "
                            f"--ntasks-per-node={here}")
    return warnings


def job_end_time(environ, run=subprocess.run):
    """The Unix time at which Slurm will end this job (its time limit), for the ranks'
    stop_requested(within=...): SLURM_JOB_END_TIME where Slurm sets it (23.02 on), else asked of
    squeue once, here, rather than by every rank; None outside Slurm, without a limit, or unknown."""
    if not environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOB_END_TIME"):
        return None
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    try:
        done = run([squeue, "-h", "-j", environ["SLURM_JOB_ID"], "-o", "%e"], capture_output=True, text=True,
                   timeout=10, stdin=subprocess.DEVNULL)
        return int(time.mktime(time.strptime(done.stdout.strip(), "%Y-%m-%dT%H:%M:%S")))
    except (OSError, subprocess.TimeoutExpired, ValueError):  # no limit ("NONE"), or squeue failed
        return None


def expand_nodelist(text):
    """`node[01-03,07],gpu1` -> [node01, node02, node03, node07, gpu1] (several [] per name too)."""
    if text.count("[") != text.count("]"):
        raise LaunchError(f"cannot read the Slurm node list {text!r}: its brackets do not pair up")
    names = []
    for item in _split_top_level(text):
        names.extend(_expand(item, text, MAX_EXPANDED - len(names)))
    return names


def expand_tasks_per_node(text):
    """`2(x3),1` -> [2, 2, 2, 1]."""
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            raise LaunchError(f"cannot read SLURM_TASKS_PER_NODE {text!r}: {item!r} is not N or N(xM)")
        repeats = int(match[2] or 1)
        if len(counts) + repeats > MAX_EXPANDED:
            raise LaunchError(f"SLURM_TASKS_PER_NODE {text[:80]!r} gives more than {MAX_EXPANDED} nodes")
        counts.extend([int(match[1])] * repeats)
    return counts


def _split_top_level(text):
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    items.append(text[start:])
    return [item for item in items if item]


def _expand(item, text, room):
    """The names `item` stands for, at most `room` of them (a LaunchError beyond)."""
    match = re.search(r"\[([^\]]*)\]", item)
    if not match:
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    names = []
    for part in match[1].split(","):
        low, _, high = part.partition("-")
        if not re.fullmatch(r"\d+", low) or not re.fullmatch(r"\d*", high):
            raise LaunchError(f"cannot read the Slurm node list {text!r}: {part!r} is not a number or a range N-M")
        width = len(low)
        if int(high or low) - int(low) + 1 > room - len(names):
            raise LaunchError(f"the Slurm node list {text[:80]!r} names more than {MAX_EXPANDED} nodes")
        for number in range(int(low), int(high or low) + 1):
            names.extend(_expand(f"{head}{number:0{width}d}{tail}", text, room - len(names)))
    return names
