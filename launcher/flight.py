"""What rrun makes of the ranks' reports (their flight records and figures, sent over the link):
each rank's last few collectives side by side when the job fails, stalls or is interrupted, on
`rrun --dump` and on SIGUSR2, with every record in a file it names; and --monitor's live view.

A report's times are its rank's clock: a collective's age is measured against the `now` the
same report carries, so the hosts' clocks need not agree."""

import contextlib
import json
import os
import sys
import threading
import time

from ringreduce.config import Config
from ringreduce.launcher import dump

SHOWN = 4  # collectives per rank in the side-by-side view (the file has them all)
MONITOR_SECONDS = 2.0  # between two lines of --monitor where stderr is no terminal


def _number(value, default=0.0):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def describe(record: dict, now: float) -> str:
    """"#12 allreduce 'loss' float32[10] at train.py:88, 0.4 ms" or "..., waiting 12 s for rank 1"."""
    shape = "x".join(str(n) for n in record.get("shape") or []) or "scalar"
    site = f" at {record['site']}" if record.get("site") else ""
    where = f" (set {record['set']})" if record.get("set") else ""
    text = (f"#{record.get('seq')} {record.get('kind')} {str(record.get('name'))!r}{where} "
            f"{record.get('dtype')}[{shape}]{site}")
    submitted, done = _number(record.get("submitted")), record.get("done")
    if done is not None:
        return f"{text}, {(_number(done) - submitted) * 1000:.1f} ms"
    waiting = record.get("waiting_for")
    of = f" for rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))}" if waiting else ""
    return f"{text}, WAITING {now - submitted:.1f} s{of}"


def side_by_side(reports: dict, why: str, few: int = SHOWN) -> str:
    """Each rank's last `few` collectives, one rank a line, oldest first."""
    lines = [f"rrun: each rank's last collectives ({why}), oldest first:"]
    for rank in sorted(reports):
        report = reports[rank]
        records = report.get("records") or []
        shown = " | ".join(describe(r, _number(report.get("now"))) for r in records[-few:])
        lines.append(f"  rank {rank}: {shown or 'no collective yet'}")
    return "\n".join(lines)


def write_records(reports: dict, why: str) -> str:
    """Every record of every rank in a new file of rrun's private directory; its path."""
    directory = dump.run_directory()
    for attempt in range(1000):
        path = os.path.join(directory, f"flight-{os.getpid()}-{int(time.time())}-{attempt}.json")
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(descriptor, "w") as file:
            json.dump({"why": why, "ranks": {str(rank): reports[rank] for rank in sorted(reports)}}, file, indent=1)
        return path
    raise OSError(f"no new file name in {directory}")


def shown(reports: dict, why: str) -> str:
    """The side-by-side view and the line naming the file with all of them ('' without records)."""
    if not any(report.get("records") for report in reports.values()):
        return ""
    try:
        where = f"rrun: every rank's last collectives are in {write_records(reports, why)}"
    except OSError as error:
        where = f"rrun: the flight records could not be written ({error})"
    return f"{side_by_side(reports, why)}\n{where}"


class Watch:
    """A thread that reads the ranks' reports each second: shows the records once when a
    collective has waited past the stall warning time, and, with --monitor, the ranks' figures.
    Also what the job's end, --dump and SIGUSR2 show."""

    def __init__(self, link, stall_seconds: float, monitor: bool) -> None:
        self.link, self.stall_seconds, self.monitor = link, stall_seconds, monitor
        self._at_end = None  # the reports asked for as the job was being ended
        self._shown_stalls: set = set()
        self._bytes: dict = {}  # rank -> (its clock, bytes) at the previous report
        self._stop = threading.Event()
        self._live = None
        self._thread = threading.Thread(target=self._run, name="rrun-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._live is not None:
            self._live.stop()

    def before_end(self) -> None:
        """The job is about to be ended (a rank failed, or rrun was interrupted): ask every rank
        still running for its records now."""
        self._at_end = self.link.fresh_reports()

    def show_end(self, why: str) -> None:
        text = shown(self._at_end or self.link.latest_reports(), why)
        if text:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def dump(self) -> str:
        """The ranks' last collectives, asked for now (rrun --dump, SIGUSR2)."""
        return (shown(self.link.fresh_reports(), "asked for while the job runs")
                or "rrun: no rank has reported a collective yet")

    def _run(self):
        last_line = 0.0
        while not self._stop.wait(1.0):
            reports = dict(self.link.latest_reports())
            self._check_stalls(reports)
            if self.monitor and reports:
                rows = self.figures(reports)
                if sys.stderr.isatty():
                    self._redraw(rows)
                elif time.monotonic() - last_line >= MONITOR_SECONDS:
                    sys.stderr.write(monitor_line(rows) + "\n")
                    sys.stderr.flush()
                    last_line = time.monotonic()

    def _check_stalls(self, reports):
        stalled = []
        for rank, report in reports.items():
            now = _number(report.get("now"))
            for record in report.get("records") or []:
                if record.get("done") is None and now - _number(record.get("submitted"), now) >= self.stall_seconds:
                    key = (rank, record.get("seq"))
                    if key not in self._shown_stalls:
                        self._shown_stalls.add(key)
                        stalled.append(rank)
        if stalled:
            sys.stderr.write(shown(reports, f"a collective has waited {self.stall_seconds:g} s or more") + "\n")
            sys.stderr.flush()

    def figures(self, reports: dict) -> list[dict]:
        """Per rank: rounds a second, the share of time it waited for others, how far behind the
        first rank it came (the last minute's average), bytes a second since its last report."""
        rows = []
        for rank in sorted(reports):
            report = reports[rank]
            now, sent = _number(report.get("now")), _number(report.get("bytes"))
            before = self._bytes.get(rank)
            rate = (sent - before[1]) / (now - before[0]) if before and now > before[0] else 0.0
            if before is None or now > before[0]:
                self._bytes[rank] = (now, sent)
            rows.append({"rank": rank, "rounds_per_second": _number(report.get("rounds_per_second")),
                         "wait_share": _number(report.get("wait_share")),
                         "behind_seconds": _number(report.get("behind_seconds")), "bytes_per_second": rate})
        return rows

    def _redraw(self, rows):
        # rich only where it draws: every rrun would pay for its import otherwise.
        from rich.console import Console
        from rich.live import Live
        from rich.table import Table

        table = Table(title="rrun --monitor (the last minute)")
        for column in ("rank", "collectives/s", "waiting", "behind the first", "MB/s"):
            table.add_column(column, justify="right")
        slowest = _slowest(rows)
        for row in rows:
            table.add_row(*_cells(row), style="bold red" if row["rank"] == slowest else None)
        if self._live is None:
            self._live = Live(table, console=Console(stderr=True), auto_refresh=False, redirect_stderr=False)
            self._live.start()
        self._live.update(table, refresh=True)


def _slowest(rows):
    worst = max(rows, key=lambda row: row["behind_seconds"], default=None)
    return worst["rank"] if worst is not None and worst["behind_seconds"] > 0 else None


def _cells(row):
    return (str(row["rank"]), f"{row['rounds_per_second']:.0f}", f"{row['wait_share']:.0%}",
            f"{row['behind_seconds'] * 1000:.1f} ms", f"{row['bytes_per_second'] / 1e6:.1f}")


def monitor_line(rows: list[dict]) -> str:
    """--monitor's line where stderr is no terminal: every rank's figures, the slowest named."""
    parts = [f"rank {rank}: {rate}/s, waiting {wait}, {behind} behind, {mb} MB/s"
             for rank, rate, wait, behind, mb in map(_cells, rows)]
    slowest = _slowest(rows)
    tail = f"; slowest: rank {slowest}" if slowest is not None else "; no rank behind"
    return "rrun monitor: " + " | ".join(parts) + tail


@contextlib.contextmanager
def observing(link, environ, monitor: bool):
    """A Watch of the job `link` serves, and the --dump socket that shows its records, for the
    time of the `with`. The stall time is the ranks' (RINGREDUCE_STALL_CHECK_TIME in `environ`)."""
    stall_seconds = float(environ.get("RINGREDUCE_STALL_CHECK_TIME") or Config.stall_check_seconds)
    watch = Watch(link, stall_seconds, monitor)
    server = dump.DumpServer(watch.dump)
    try:
        yield watch
    finally:
        server.close()
        watch.close()
