"""Elastic jobs (rrun --min-np/--max-np/--host-discovery-script, as horovodrun's): the job runs as a
series of generations, each one mpiexec over the hosts usable then. MPI cannot shrink a running job
here (see docs/elastic.md), so a resize starts new processes, which resume from the newest commit
(ringreduce.elastic keeps commits on every host).

A generation ends in one of three ways: the training function returned (the job is done), the ranks
left to resize at a commit after rrun told them of new hosts, or a rank failed (or stopped beating).
After a failure the next generation starts from the newest commit: on the same hosts where the
failed one still answers (a crashed process says nothing about its host), without a host that
stopped beating or whose ranks keep failing (SetAside), if what is left has --min-np slots; where
no host can come back, the job ends at once, saying which hosts were set aside and why."""

import dataclasses
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import uuid

import click

from ringreduce.launcher import flight, hosts, link, protocol, rank, torchrun
from ringreduce.launcher.errors import LaunchError
from ringreduce.launcher.supervise import Supervisor, report_how

DISCOVERY_INTERVAL = 1.0  # seconds between runs of the discovery script while a generation runs
DISCOVERY_TIMEOUT = 30.0


@dataclasses.dataclass(frozen=True)
class Settings:
    min_np: int
    max_np: int | None
    discovery_script: str
    slots_per_host: int | None = None
    elastic_timeout: float = 600.0
    reset_limit: int | None = None
    cooldown_range: tuple[float, float] | None = None
    heartbeat_seconds: float = protocol.DEFAULT_HEARTBEAT_SECONDS
    commit_dir: str | None = None
    tries_per_host: int = 2


class ScriptCannotRun(LaunchError):
    """The discovery script could not be started at all (missing, not executable, no #! line)."""


def discover(script, slots_per_host):
    """The hosts the discovery script prints now: `host:slots` lines (or `host`, with
    --slots-per-host slots), in its order."""
    try:
        done = subprocess.run(shlex.split(script) if " " in script else [script], capture_output=True, text=True,
                              timeout=DISCOVERY_TIMEOUT, stdin=subprocess.DEVNULL)
    except OSError as error:
        raise ScriptCannotRun(f"--host-discovery-script {script} cannot be run ({error.strerror}): it must be an "
                              "executable file, a script with its #! line") from None
    except subprocess.TimeoutExpired as error:
        raise LaunchError(f"--host-discovery-script {script}: {error}") from None
    if done.returncode != 0:
        raise LaunchError(f"--host-discovery-script {script} exited with status {done.returncode}: "
                          f"{done.stderr.strip()[-300:]}")
    found = []
    for line in done.stdout.splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        host = hosts.parse_hosts(text)[0]
        if ":" not in text:
            if slots_per_host is None:
                raise LaunchError(f"--host-discovery-script printed {text!r} without slots: print host:slots, "
                                  "or give --slots-per-host")
            host = hosts.Host(host.name, slots_per_host)
        found.append(host)
    slots = {}
    for host in found:  # a host on several lines: their slots together
        slots[host.name] = slots.get(host.name, 0) + host.slots
    return [hosts.Host(name, count) for name, count in slots.items()]


class SetAside:
    """Hosts set aside, and why. Only what says that a host is bad sets it aside: it stopped
    answering (the heartbeat), or its ranks failed `tries` times in a row with no commit made in
    between; a rank that fails once on a host that answers is started there again. A host is set
    aside for good without a cool-down range, else for the range's low end, doubled with each
    further time, at most its high end (Horovod's --blacklist-cooldown-range)."""

    def __init__(self, cooldown_range, tries=2, clock=time.monotonic):
        self.cooldown_range = cooldown_range
        self.tries = tries
        self.clock = clock
        self.failures = {}  # host -> times set aside
        self.in_a_row = {}  # host -> failures of its ranks since the last commit
        self.until = {}  # host -> clock time it may come back (inf: never)
        self.why = {}  # host -> why it was set aside

    def failed(self, host, why, unreachable=False):
        """A generation failed on `host` (`why`); seconds it is set aside for (inf: for good), or
        None where its ranks start there again."""
        if not unreachable:
            count = self.in_a_row[host] = self.in_a_row.get(host, 0) + 1
            if count < self.tries:
                return None
            why = f"its ranks failed {count} times in a row without a commit; the last: {why}"
        return self.add(host, why)

    def committed(self):
        """The ranks made a commit: the failures before it no longer count against their hosts."""
        self.in_a_row.clear()

    def add(self, host, why=""):
        count = self.failures[host] = self.failures.get(host, 0) + 1
        self.in_a_row.pop(host, None)
        if self.cooldown_range is None:
            seconds = float("inf")
        else:
            low, high = self.cooldown_range
            seconds = min(high, low * 2 ** (count - 1))
        self.until[host] = self.clock() + seconds
        self.why[host] = why
        return seconds

    def usable(self, found):
        now = self.clock()
        return [h for h in found if self.until.get(h.name, 0) <= now]

    def none_can_come_back(self, found):
        """True when no host of `found` (the discovery script's) is usable and none will be: every
        one listed is set aside for good (or none is listed, after a host was set aside for good)
        and no cool-down runs."""
        now = self.clock()
        cooling = any(now < until < float("inf") for until in self.until.values())
        gone = [name for name, until in self.until.items() if until == float("inf")]
        return not cooling and bool(gone) and all(self.until.get(h.name) == float("inf") for h in found)

    def describe(self, why=False):
        now = self.clock()
        return ", ".join(f"{host} ({'for good' if until == float('inf') else f'back in {until - now:.0f} s'}"
                         + (f": {self.why[host]}" if why and self.why.get(host) else "") + ")"
                         for host, until in self.until.items() if until > now)


class ElasticRun:
    def __init__(self, settings, num_proc, job, command, verbose, grace_seconds, launch_of, in_place=False,
                 monitor=False):
        """`job`: a dialects.JobSpec that each generation's size and hosts complete; `command`: the
        user's; `launch_of(job)`: how mpiexec starts a JobSpec (dialects.Launch). `in_place`: the MPI can
        shrink a job (ULFM), so the survivors of a failure go on in their processes."""
        self.settings, self.first_size, self.job, self.command = settings, num_proc, job, command
        self.verbose, self.grace_seconds, self.launch_of = verbose, grace_seconds, launch_of
        self.set_aside = SetAside(settings.cooldown_range, settings.tries_per_host)
        self.job_id = uuid.uuid4().hex[:12]
        self.in_place = in_place
        self.monitor = monitor
        self.watch = None  # the flight.Watch of the job's link, while it runs
        self._resets = 0  # generations that failed
        self._failed_at = None  # when the last generation ended, if it did not end the job

    def run(self):
        """Generations until the job is done (0), interrupted, or cannot go on; rrun's exit status."""
        where = self.settings.commit_dir or protocol.DEFAULT_COMMIT_DIR.format(job=self.job_id)
        _say(f"elastic job {self.job_id}: each host keeps its commits in {where}"
             + ("; the MPI shrinks jobs (ULFM): the survivors of a failure go on in place" if self.in_place else ""))
        with link.LinkServer(self.settings.heartbeat_seconds, self.job.env[protocol.SECRET_VARIABLE]) as link_server, \
                flight.observing(link_server, {**os.environ, **self.job.env}, self.monitor) as self.watch:
            return self._generations(link_server)

    def _generations(self, link_server):
        """Run generation after generation until one ends the job; the job's exit status."""
        generation = 0
        while True:
            placement = self._placement(self.first_size if generation == 0 else None, first=generation == 0)
            job = self._generation_job(generation, placement, link_server)
            _say(f"generation {generation}: {job.num_proc} ranks on {', '.join(f'{h}:{n}' for h, n in placement)}")
            status, supervisor, messages = self._run_generation(job, placement, link_server)
            if supervisor.interrupted_by is not None:
                return status
            ended = self._outcome(status, supervisor, messages, placement)
            if ended is not None:
                return ended
            generation += 1

    def _generation_job(self, generation, placement, link_server):
        """The JobSpec of one generation on `placement`, with torchrun's rendezvous on its first
        host (a new port each generation)."""
        size = sum(count for _, count in placement)
        env = {**self.job.env, protocol.GENERATION_VARIABLE: str(generation),
               protocol.JOB_VARIABLE: self.job_id, **link_server.env([host for host, _ in placement]),
               **torchrun.rendezvous(placement, os.environ)}
        if self.settings.commit_dir:
            env[protocol.COMMIT_DIR_VARIABLE] = self.settings.commit_dir
        rank_command = rank.wrapped(size, self.command)
        if self.in_place:
            # Open MPI must see the ranks themselves die, to tell the survivors: no wrapper
            # (rrun's link tells it of a rank that dies; Open MPI tags the lines).
            rank_command = list(self.command)
            env.update({protocol.IN_PLACE_VARIABLE: "1", protocol.WORLD_SIZE_VARIABLE: str(size),
                        "PYTHONUNBUFFERED": "1"})
        return dataclasses.replace(self.job, num_proc=size, placement=placement, env=env, rank_command=rank_command,
                                   fault_tolerant=self.in_place)

    def _run_generation(self, job, placement, link_server):
        """(exit status, its Supervisor, what the ranks said over the link) of one generation."""
        started = len(link_server.messages)
        survivors = _Survivors(self, placement, link_server) if self.in_place else None
        supervisor = Supervisor(self.launch_of(job), self.verbose, self.grace_seconds, survivors, self.watch)
        link_server.watch(supervisor)
        link_server.on_gone = supervisor.take_report if survivors is not None else None
        watcher = _HostWatcher(self, placement, link_server, survivors)
        watcher.start()
        try:
            status = supervisor.run()
        finally:
            watcher.stop()
        messages = link_server.messages[started:]
        events = [(self._failed_at, "the last generation ended")] if self._failed_at is not None else []
        events += [(failed, "the failure") for failed in (survivors.failed_at if survivors else [])]
        _say_resumes(messages, events)
        return status, supervisor, messages

    def _outcome(self, status, supervisor, messages, placement):
        """The job's exit status where this generation ends it, else None (after setting aside the
        host a failure blames)."""
        resizing = any(m["kind"] == "resizing" for _, _, m in messages)
        if any(m["kind"] == "done" for _, _, m in messages):  # (mpiexec's status is not 0 after a failure survived)
            return 0
        if status == 0 and not resizing:
            return 0
        if status == 0:
            _say("the ranks stopped at a commit to take in the hosts that changed")
            self._failed_at = time.time()
            return None
        host = placement_host(supervisor.blamed_host(), [name for name, _ in placement])
        self._failed_at = supervisor.failed_at() or time.time()
        self._resets += 1
        if self.settings.reset_limit is not None and self._resets > self.settings.reset_limit:
            _say(f"the job failed {self._resets} times, more than --reset-limit {self.settings.reset_limit}")
            return status
        if any(m["kind"] == "committed" for _, _, m in messages):
            self.set_aside.committed()
        if host is not None:
            unreachable = supervisor.ended_for is not None  # it stopped beating: cut off or frozen
            why = supervisor.ended_for[0] if unreachable else supervisor.failure_text()
            seconds = self.set_aside.failed(host, why, unreachable)
            if seconds is None:
                _say(f"{host} answers: its ranks start there again")
            else:
                _say(f"setting {host} aside {'for good' if seconds == float('inf') else f'for {seconds:g} s'} "
                     f"({self.set_aside.why[host]}) and going on without it")
        return None

    def _placement(self, wanted, first=False):
        """[(host, ranks)] for the next generation: as many as the usable hosts' slots allow (at
        most --max-np; the first generation at most -np), waiting for --min-np slots up to
        --elastic-timeout."""
        deadline = time.monotonic() + self.settings.elastic_timeout
        said = None
        while True:
            try:
                found = discover(self.settings.discovery_script, self.settings.slots_per_host)
            except LaunchError as error:  # as the watcher does: the script may work the next time
                if time.monotonic() > deadline or (first and isinstance(error, ScriptCannotRun)):
                    raise  # a script that cannot even start before the first generation: a mistake, said at once
                _say(f"{error}; trying again")
                time.sleep(DISCOVERY_INTERVAL)
                continue
            usable = self.set_aside.usable(found)
            slots = sum(h.slots for h in usable)
            if slots >= self.settings.min_np:
                size = min([slots] + [n for n in (self.settings.max_np, wanted) if n is not None])
                return hosts.place(usable, size)
            if self.set_aside.none_can_come_back(found):
                raise LaunchError(f"no host can run the job: {slots} usable slots, --min-np is {self.settings.min_np}, "
                                  f"and none comes back; set aside: {self.set_aside.describe(why=True)}")
            if time.monotonic() > deadline:
                raise LaunchError(f"waited {self.settings.elastic_timeout:g} s (--elastic-timeout) for the "
                                  f"{self.settings.min_np} slots of --min-np; the hosts usable have {slots}")
            message = f"waiting for hosts: {slots} usable slots, --min-np is {self.settings.min_np}"
            if self.set_aside.describe():
                message += f"; set aside: {self.set_aside.describe(why=True)}"
            if message != said:
                _say(message)
                said = message
            time.sleep(DISCOVERY_INTERVAL)


def _say_resumes(messages, events):
    """For each (time, what) of `events` (the last generation's end, a failure survived in place),
    how long until the ranks went on: the first resume after it."""
    resumed = [(when, message) for when, _, message in messages if message["kind"] == "resumed"]
    for event, what in events:
        first = min(((when, m) for when, m in resumed if when >= event), key=lambda item: item[0], default=None)
        if first is not None:
            when, message = first
            commit = "the start" if message["commit"] is None else f"commit {message['commit']}"
            _say(f"resumed from {commit} on {message['size']} ranks{' in place' if message.get('in_place') else ''}, "
                 f"{when - event:.2f} s after {what}")


class _Survivors:
    """Where the MPI shrinks jobs in place: decides, for each rank that fails, whether the others go
    on without it (while at least --min-np are left) and tells them so over the link. The host is
    not set aside: the others on it may go on (where it died, they all fail)."""

    def __init__(self, run, placement, link_server):
        self.run, self.link_server = run, link_server
        self.alive = sum(count for _, count in placement)
        self.failed_at = []  # when each failure the others went on after happened

    def __call__(self, report):
        self.alive -= 1
        if self.alive < self.run.settings.min_np:
            return False
        why = f"rank {report['rank']} (on {report['host']}) failed: {report_how(report)}"
        self.link_server.notify("rank-failed", why=why)
        _say(f"{why}; the {self.alive} others go on in place from their last commit")
        self.failed_at.append(report["time"])
        return True


def placement_host(reported, names):
    """The name in `names` (the discovery script's) of the host a rank reported as `reported` (its
    own host name): the same name, the same short name, or the same address (localhost is this
    machine); None for None."""
    if reported is None or reported in names:
        return reported

    def address(name):
        if name == "localhost" or name == socket.gethostname():
            return "127.0.0.1"
        try:
            return socket.gethostbyname(name)
        except OSError:
            return None

    short = reported.split(".")[0]
    for name in names:
        if name.split(".")[0] == short:
            return name
    wanted = address(reported)
    return next((name for name in names if wanted is not None and address(name) == wanted), reported)


class _HostWatcher:
    """Runs the discovery script while a generation runs; tells the ranks (once, those still
    starting too) when the hosts they could use differ from the ones they run on, so they resize at
    their next commit. Where the MPI shrank the job in place (`survivors`), the ranks left are what
    it runs: a slot a failed rank left counts as one to grow into, up to --max-np, so a replacement
    starts."""

    def __init__(self, run, placement, link_server, survivors=None):
        self.run, self.placement, self.link_server = run, dict(placement), link_server
        self.survivors = survivors
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rrun-discovery", daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()

    def _watch(self):
        settings = self.run.settings
        while not self._stop.wait(DISCOVERY_INTERVAL):
            try:
                usable = self.run.set_aside.usable(discover(settings.discovery_script, settings.slots_per_host))
            except LaunchError as error:
                _say(f"{error}; trying again")
                continue
            size = self.survivors.alive if self.survivors is not None else sum(self.placement.values())
            slots = sum(h.slots for h in usable)
            # A job shrunk in place grows back (a replacement on the slot its dead rank left) only
            # where --max-np asks for that size: its survivors otherwise finish at their size.
            limit = settings.max_np if settings.max_np is not None or self.survivors is None else size
            can_grow = slots > size and (limit is None or size < limit)
            lost = set(self.placement) - {h.name for h in usable}
            if can_grow or lost:
                what = [f"{slots} usable slots for {size} ranks"] if can_grow else []
                what += [f"hosts gone: {', '.join(sorted(lost))}"] if lost else []
                _say(f"discovery: {'; '.join(what)}; the ranks resize at their next commit")
                self.link_server.announce("hosts-updated")
                return


def _say(message):
    click.echo(f"rrun: {message}", err=True)
    sys.stderr.flush()
