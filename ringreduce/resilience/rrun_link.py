"""This rank's end of the link to rrun (ringreduce.launcher.protocol): started at init where rrun
asked for it (RRUN_LINK). A thread beats, each beat with this rank's report (its flight records and
figures, where the runtime gives a `reporter`), takes rrun's notices (hosts-updated, for elastic
jobs; report-now) and, where the job has a heartbeat timeout and rrun has been silent that long,
ends this process: rrun has given up on this host (its link was cut), so the rest of the job has
gone on without it, and nothing else would end a rank blocked in MPI on a host cut off from the
others."""

import os
import selectors
import socket
import sys
import threading
import time

from ringreduce.errors import RingReduceError
from ringreduce.launcher import protocol
from ringreduce.machine import faults

LOST_EXIT_CODE = 75  # ended for lost contact with rrun (EX_TEMPFAIL)


class Link:
    def __init__(self, address, timeout, rank, secret, reporter=None):
        """Connect, take rrun's challenge and say a hello signed for it with the job's `secret`.
        `timeout`: the heartbeat's (None: rrun's silence ends nothing). `reporter()` gives the
        fields of this rank's report."""
        self.timeout = timeout
        self.rank = rank
        self.reporter = reporter
        self.hosts_updated = threading.Event()
        host, _, port = address.rpartition(":")
        self._socket = socket.create_connection((host, int(port)),
                                                timeout=timeout or protocol.DEFAULT_HEARTBEAT_SECONDS)
        challenge = b""
        while b"\n" not in challenge:
            data = self._socket.recv(4096)
            if not data:
                raise OSError("rrun closed the link before its challenge")
            challenge += data
        first, _, self._received = challenge.partition(b"\n")
        self._secret, self._nonce = secret, protocol.parse_link_message(first)["nonce"]
        self._lock = threading.Lock()
        self._pending = b""
        self.send("hello", rank=rank, host=socket.gethostname(), pid=os.getpid())
        self._socket.setblocking(False)
        threading.Thread(target=self._run, name="ringreduce-rrun-link", daemon=True).start()

    def rejoin(self, rank):
        """Say this process's new rank (the job shrank)."""
        self.rank = rank
        self.send("hello", rank=rank, host=socket.gethostname(), pid=os.getpid())

    def send(self, kind, **fields):
        """Send a message to rrun now, as far as the socket takes it; the link's thread writes the
        rest within a beat."""
        with self._lock:
            self._pending += protocol.signed_link_message(self._secret, self._nonce, kind, **fields)
        self.flush(seconds=0)

    def flush(self, seconds=2.0):
        """Write what is queued, trying for up to `seconds` (0: what the socket takes now)."""
        deadline = time.monotonic() + seconds
        while True:
            with self._lock:
                try:
                    sent = self._socket.send(self._pending) if self._pending else 0
                except BlockingIOError:
                    sent = 0
                except OSError:
                    return
                self._pending = self._pending[sent:]
                if not self._pending or time.monotonic() >= deadline:
                    return
            time.sleep(0.01)

    def report(self):
        """Send this rank's report now; its oldest flight records are left out where the line
        would be longer than rrun takes."""
        if self.reporter is None:
            return
        try:
            fields = self.reporter()
        except Exception as error:  # the runtime is shutting down under us: the next beat tries again
            fields = {"records": [], "now": time.time(), "problem": f"{type(error).__name__}: {error}"}
        line = protocol.signed_link_message(self._secret, self._nonce, "report", **fields)
        while len(line) > protocol.MAX_LINE_BYTES and fields["records"]:
            fields["records"] = fields["records"][len(fields["records"]) // 4 + 1:]
            line = protocol.signed_link_message(self._secret, self._nonce, "report", **fields)
        with self._lock:
            self._pending += line
        self.flush(seconds=0)

    def _run(self):
        interval = protocol.beat_interval(self.timeout or protocol.DEFAULT_HEARTBEAT_SECONDS)
        heard, beaten, received = time.monotonic(), 0.0, self._received
        with selectors.DefaultSelector() as selector:
            selector.register(self._socket, selectors.EVENT_READ)
            while True:
                now = time.monotonic()
                if now - beaten >= interval:
                    self.send("beat")
                    self.report()
                    beaten = now
                self.flush(seconds=0)
                for _ in selector.select(timeout=interval):
                    try:
                        data = self._socket.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:  # rrun closed its end: it is gone, or done with this generation
                        self._lose("rrun closed the link")
                    heard, received = time.monotonic(), received + data
                    *lines, received = received.split(b"\n")
                    for line in lines:
                        message = protocol.parse_link_message(line)
                        if message["kind"] == "hosts-updated":
                            self.hosts_updated.set()
                        elif message["kind"] == "rank-failed":  # the job goes on without it (ULFM)
                            faults.report(message["why"])
                        elif message["kind"] == "report-now":
                            self.report()
                if self.timeout is not None and time.monotonic() - heard > self.timeout:
                    self._lose(f"no word from rrun for {self.timeout:g} s (this host's link is down, or rrun's "
                               "host is)")

    def _lose(self, why):
        sys.__stderr__.write(f"ringreduce: rank {self.rank} lost contact with rrun: {why}; ending this rank, "
                             "which the others no longer wait for\n")
        sys.__stderr__.flush()
        os._exit(LOST_EXIT_CODE)


_link = None


def connect(rank, reporter=None, environ=os.environ):
    """Start the link where rrun asked for it; idempotent. Where the job has no heartbeat, a link
    that cannot be made only costs rrun this rank's report, and says so."""
    global _link
    address = environ.get(protocol.LINK_VARIABLE)
    if address and _link is None:
        timeout = environ.get(protocol.HEARTBEAT_VARIABLE)
        secret = environ.get(protocol.SECRET_VARIABLE)
        if not secret:
            raise RingReduceError(f"rank {rank}: rrun gave a link ({protocol.LINK_VARIABLE}) but not the job's secret "
                                  f"({protocol.SECRET_VARIABLE}): start the job with this ringreduce's rrun")
        try:
            _link = Link(address, None if timeout is None else float(timeout), rank, secret, reporter)
        except OSError as error:
            problem = (f"rank {rank} cannot reach rrun at {address} ({error}): a firewall between this host and "
                       "rrun's, or rrun advertised an address this host cannot route to (give rrun -i with the "
                       "interface the hosts share)")
            if timeout is not None:
                raise RingReduceError(problem) from None
            print(f"ringreduce: {problem}; rrun will not show this rank's last collectives", file=sys.stderr,
                  flush=True)
    return _link


def current():
    """The link to rrun, or None where the job has none."""
    return _link
