"""Running mpiexec: relaying the ranks' output, stopping the whole job when one rank fails
or rrun is interrupted, leaving no process behind, and saying which rank failed first (after
which mpiexec's own cleanup banners are not shown, unless asked for with --verbose)."""

import os
import re
import signal
import subprocess
import sys
import threading

import psutil

from ringreduce.launcher.banners import BannerFilter
from ringreduce.launcher.protocol import MAX_TAGGED_LINE, SECRET_VARIABLE, parse_status

GRACE_SECONDS = 3.0
POLL_SECONDS = 0.1


class Supervisor:
    def __init__(self, launch, verbose=False, grace_seconds=GRACE_SECONDS, on_failure=None, watch=None):
        """`launch`: mpiexec's command line and what its environment adds (dialects.Launch).
        `on_failure(report)`, where given, is asked about each rank that fails: true when the job
        goes on without it (its survivors shrink in place), so it is not ended. `watch`
        (flight.Watch) asks the ranks for their records before rrun ends them, and prints them
        on SIGUSR2."""
        self.launch = launch
        self.watch = watch
        self._secret = launch.variables.get(SECRET_VARIABLE)  # what signs the ranks' status lines
        self.on_failure = on_failure
        self.verbose = verbose
        self.grace_seconds = grace_seconds
        self._banners = {}  # sink -> BannerFilter of mpiexec's own lines to it
        self.reports = []
        self.interrupted_by = None
        self.ended_for = None  # (what rrun says, the host to blame) when rrun ended the job itself
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._family = {}  # pid -> psutil.Process: every local process the job has started

    def run(self):
        """Run the job to its end; return rrun's exit status."""
        self.process = subprocess.Popen(
            self.launch.argv, env=self.launch.environment(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C reaches rrun alone; rrun ends the job
        )
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._pass_on)
        if self.watch is not None:
            previous[signal.SIGUSR2] = signal.signal(signal.SIGUSR2, self._dump)
        relays = [
            threading.Thread(target=self._relay, args=(self.process.stdout, sys.stdout.buffer)),
            threading.Thread(target=self._relay, args=(self.process.stderr, sys.stderr.buffer)),
        ]
        for relay in relays:
            relay.start()
        try:
            while self.process.poll() is None and not self._stop.wait(POLL_SECONDS):
                self._remember_family()
            if self.process.poll() is None:
                if self.watch is not None:
                    self.watch.before_end()
                self._end_job()
            self.process.wait()
            for relay in relays:
                relay.join()
        finally:
            self._kill_leftovers()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self._verdict()

    def end(self, message, host):
        """End the job for a reason rrun found itself (a rank that stopped beating), blaming `host`,
        at once: no grace period, since mpiexec cannot reach a host cut off, and the ranks it can
        reach wait for that host in vain."""
        self.ended_for = (message, host)
        self.grace_seconds = 0
        self._stop.set()

    def blamed_host(self):
        """The host of the failure that ended the job (None if it did not fail)."""
        if self.ended_for is not None:
            return self.ended_for[1]
        first = self._first_failure()
        return first["host"] if first else None

    def failed_at(self):
        """When the job's failure happened (time.time()), or None."""
        first = self._first_failure()
        return first["time"] if first else None

    def failure_text(self):
        """'rank 2 (on vm) failed: killed by signal 9 (SIGKILL)', of the failure that ended the job."""
        first = self._first_failure()
        if first is None:
            return "the job failed"
        return f"rank {first['rank']} (on {first['host']}) failed: {report_how(first)}"

    def _first_failure(self):
        """The report of the rank that failed first (one that left while others waited is to blame
        for their PeerExitedError), or None."""
        failures = [r for r in self.reports if r["code"] != 0 and r["stopped_by"] is None and not r.get("survived")]
        if not failures:
            return None
        leaving = [r for r in self.reports if r.get("left")]
        first = min(failures + leaving, key=lambda r: r["time"])
        if leaving and "PeerExitedError" in (first["last_error"] or ""):
            first = min(leaving, key=lambda r: r["time"])
        return first

    def _pass_on(self, signum, _frame):
        """A preemption notice (SIGUSR1): every rank gets it, through mpiexec, and goes on."""
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def _dump(self, _signum, _frame):
        """SIGUSR2: the ranks' last collectives on rrun's stderr, the job going on (asked for on
        another thread: the ranks take a moment to answer)."""
        threading.Thread(target=lambda: _write(sys.stderr.buffer, [self.watch.dump().encode() + b"\n"]),
                         daemon=True).start()

    def _on_signal(self, signum, _frame):
        self.interrupted_by = signal.Signals(signum)
        self._stop.set()

    def _relay(self, source, sink):
        banners = self._banners[sink] = BannerFilter()
        for line in iter(lambda: source.readline(MAX_TAGGED_LINE), b""):
            line = _untagged(line, self._secret)
            report = parse_status(line, self._secret)
            if report is not None:
                self.take_report(report)
                continue
            if not line.endswith(b"\n"):
                # A last line cut short; Open MPI's launcher ends with a lone NUL byte.
                line = line.rstrip(b"\x00")
                line = line + b"\n" if line else line
            # The ranks' lines carry their rank ("[3]<stdout>:"); the others are mpiexec's own.
            _write(sink, [line] if line.startswith(b"[") else banners.feed(line))
        _write(sink, banners.flush())

    def take_report(self, report):
        """A rank ended: its wrapper's status line, or (where ranks run without it) rrun's link seeing it go."""
        with self._lock:
            self.reports.append(report)
        if report["code"] != 0 and report["stopped_by"] is None:
            if self.on_failure is not None and self.on_failure(report):
                report["survived"] = True
                return
            self._stop.set()  # fail fast: one rank failed, so end them all

    def _remember_family(self):
        try:
            root = psutil.Process(self.process.pid)
            for member in [root] + root.children(recursive=True):
                self._family.setdefault(member.pid, member)
        except psutil.Error:
            pass

    def _end_job(self):
        """SIGTERM to mpiexec (it ends the ranks on every host), then, after the grace period,
        SIGKILL what is left here."""
        self._remember_family()
        try:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(self.grace_seconds)
        except subprocess.TimeoutExpired:
            pass
        self._kill_leftovers()

    def _kill_leftovers(self):
        alive = [p for p in self._family.values() if _still_running(p)]
        for member in alive:
            try:
                member.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=GRACE_SECONDS)

    def _verdict(self):
        """rrun's exit status, saying why the job ended where it failed: each rank's last
        collectives first, then (the last line) what ended it."""
        if self.interrupted_by is not None:
            self._show_flights(f"the job was stopped by {self.interrupted_by.name}")
            _say(f"stopped by {self.interrupted_by.name}; every rank was ended")
            return 128 + self.interrupted_by
        if self.ended_for is not None:
            self._show_banners()
            self._show_flights("rrun ended the job")
            _say(self.ended_for[0])
            return 1
        first = self._first_failure()
        if first is not None:
            self._show_banners()
            self._show_flights("the job failed")
            _say(f"rank {first['rank']} (on {first['host']}) failed first: {report_how(first)}")
            code = first["code"] or 1
            return code if code > 0 else 128 - code
        self._show_banners(always=True)
        if self.process.returncode != 0:
            self._show_flights("the job failed")
            _say(f"{os.path.basename(self.launch.argv[0])} exited with status {self.process.returncode}")
            return self.process.returncode if self.process.returncode > 0 else 1
        return 0

    def _show_flights(self, why):
        if self.watch is not None:
            self.watch.show_end(why)

    def _show_banners(self, always=False):
        """mpiexec's cleanup banners: shown where rrun names no failed rank, or with --verbose."""
        if always or self.verbose:
            for sink, banners in self._banners.items():
                _write(sink, banners.held)


_OPEN_MPI_TAG = re.compile(rb"^\[\d+,(\d+)\]<(stdout|stderr)>: ?")


def _untagged(line, secret):
    """A line of a rank that Open MPI tagged itself (`[1,3]<stdout>: text`, where the ranks run without
    rrun's wrapper) in rrun's form, `[3]<stdout>:text`; a status line without its tag."""
    match = _OPEN_MPI_TAG.match(line)
    if match is None:
        return line
    text = line[match.end():]
    return text if parse_status(text, secret) is not None else b"[%s]<%s>:%s" % (match[1], match[2], text)


def _write(sink, lines):
    if lines:
        sink.writelines(lines)
        sink.flush()


def _still_running(process):
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def report_how(report):
    code = report["code"]
    if report.get("left"):
        return f"left the job while others waited for it (its script ended or called sys.exit): {report['left']}"
    if code is None:  # seen by its link to rrun closing, where no wrapper reports its exit
        return "its process ended without a word to rrun (killed, or crashed)"
    if code < 0:
        how = f"killed by signal {-code} ({signal.Signals(-code).name})"
    else:
        how = f"exited with status {code}"
    return how + (f"; its last error line: {report['last_error']}" if report["last_error"] else "")


def _say(message):
    sys.stderr.write(f"rrun: {message}\n")
    sys.stderr.flush()
