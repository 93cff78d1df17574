"""rrun's end of the link to the ranks (ringreduce.launcher.protocol): a server the ranks connect
to at init. It beats to every rank, passes on notices (hosts-updated), records what the ranks say
(which host each runs on, the commit a generation resumed from, each rank's latest report), and,
where the job has a heartbeat, reports a rank that has been silent for its timeout: its host froze
or its link was cut, which neither TCP nor MPI says in time.

Anyone who can reach the port can connect, so a connection counts only once it has proved it
knows the job's secret: its first line, a hello signed for the nonce rrun sent it, within
AUTH_SECONDS. Until then it is a stranger: not a rank, never silent, never heard; any line that
is unsigned, too long or not a rank's message drops that connection and nothing else."""

import secrets
import selectors
import socket
import sys
import threading
import time

from ringreduce.launcher import protocol

AUTH_SECONDS = 5.0  # a connection that has not said a signed hello by then is dropped
MAX_STRANGERS = 64  # connections not yet proved; beyond, the oldest is dropped for a new one
MAX_PEERS = 65536


class LinkServer:
    def __init__(self, timeout: float | None, secret: str, hosts: list[str] | None = None) -> None:
        """Listening on the address the ranks on `hosts` are given (loopback where all are this
        host), or on every interface where the hosts are not known yet (an elastic job's).
        `timeout`: the heartbeat's, None for none (a silent rank then ends nothing)."""
        self.timeout, self._secret = timeout, secret
        self.supervisor = None  # the Supervisor of the job running now, which a silent rank ends
        self.on_gone = None  # where ranks run without rrun's wrapper: told of a rank that left without a word
        self._listener = socket.create_server((advertised_host(hosts) if hosts is not None else "", 0))
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._peers = {}  # socket -> _Peer
        self._announced = b""  # the notices every rank of the job watched now must hear (announce)
        self._closed = threading.Event()
        self.messages = []  # (time, rank, message) of the ranks' messages other than beats and reports
        self.reports = {}  # rank -> (time.monotonic() when heard, its latest report)
        self._report_heard = threading.Condition(self._lock)
        self._silent_reported = False
        self._thread = threading.Thread(target=self._serve, name="rrun-link", daemon=True)
        self._thread.start()

    def env(self, hosts):
        """The variables that tell ranks on `hosts` where rrun's end is, and the timeout."""
        address = f"{advertised_host(hosts)}:{self._listener.getsockname()[1]}"
        return {protocol.LINK_VARIABLE: address,
                **({} if self.timeout is None else {protocol.HEARTBEAT_VARIABLE: str(self.timeout)})}

    def watch(self, supervisor):
        """Watch the ranks of `supervisor`'s job from now on: the last job's connections are closed
        (any rank of it still alive ends itself), and a silent rank ends this job."""
        with self._lock:
            for peer in list(self._peers.values()):
                self._drop(peer)
            self.supervisor, self._silent_reported, self._announced = supervisor, False, b""
            self.reports = {}

    def notify(self, kind, **fields):
        """Send a notice to every connected rank."""
        with self._lock:
            self._to_connected(protocol.link_message(kind, **fields))

    def announce(self, kind, **fields):
        """Send a notice to every rank of the job watched now, those that connect later too: a
        rank still starting (importing its framework, seconds on a slow host) would miss one sent
        only to the ranks connected."""
        with self._lock:
            message = protocol.link_message(kind, **fields)
            self._announced += message
            self._to_connected(message)

    def _to_connected(self, message):
        """Queue `message` for every connected rank (the lock held)."""
        for peer in self._peers.values():
            if peer.proved:
                peer.outgoing += message

    def latest_reports(self):
        """{rank: its latest report} of the job watched now."""
        with self._lock:
            return {rank: report for rank, (_, report) in self.reports.items()}

    def fresh_reports(self, seconds=1.0):
        """Every connected rank's report, asked for now: waits up to `seconds` for each to answer
        (a rank that does not keeps its latest beat's)."""
        asked = time.monotonic()
        with self._lock:
            self._to_connected(protocol.link_message("report-now"))
        self._send_all()
        deadline = asked + seconds
        with self._report_heard:
            while True:
                ranks = {p.rank for p in self._peers.values() if p.proved}
                if all(self.reports.get(rank, (0,))[0] >= asked for rank in ranks):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._report_heard.wait(left)
        return self.latest_reports()

    def ranks(self):
        """{rank: host} of the ranks connected now."""
        with self._lock:
            return {p.rank: p.host for p in self._peers.values() if p.proved}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._closed.set()
        self._thread.join()
        with self._lock:
            for peer in list(self._peers.values()):
                self._drop(peer)
        self._selector.close()
        self._listener.close()

    def _serve(self):
        interval = protocol.beat_interval(self.timeout or protocol.DEFAULT_HEARTBEAT_SECONDS)
        beaten = 0.0
        while not self._closed.is_set():
            for key, _ in self._selector.select(timeout=interval):
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._receive(key.data)
            now = time.monotonic()
            if now - beaten >= interval:
                self.notify("beat")
                beaten = now
            self._send_all()
            self._check_silence(now)

    def _accept(self):
        try:
            connection, _ = self._listener.accept()
        except BlockingIOError:
            return
        except OSError as error:  # out of descriptors, say: the server goes on, the backlog waits
            sys.stderr.write(f"rrun: the link cannot accept a connection now ({error})\n")
            time.sleep(0.1)
            return
        connection.setblocking(False)
        peer = _Peer(connection, secrets.token_hex(16))
        peer.outgoing = protocol.link_message("challenge", nonce=peer.nonce)
        with self._lock:
            strangers = [p for p in self._peers.values() if not p.proved]
            if len(strangers) >= MAX_STRANGERS:
                self._drop(min(strangers, key=lambda p: p.connected))
            if len(self._peers) >= MAX_PEERS:
                connection.close()
                return
            self._peers[connection] = peer
        self._selector.register(connection, selectors.EVENT_READ, peer)

    def _receive(self, peer):
        try:
            data = peer.socket.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._left(peer)
            return
        with self._lock:
            *lines, peer.received = (peer.received + data).split(b"\n")
            try:
                if len(peer.received) > protocol.MAX_LINE_BYTES:
                    raise ValueError("a line longer than a rank's")
                for line in lines:
                    self._heard(peer, protocol.checked_rank_message(self._secret, peer.nonce, line))
            except ValueError:
                self._drop(peer)  # a stranger's (or a broken) connection: it alone goes

    def _heard(self, peer, message):
        """A signed message from `peer` (the lock held): its first must be its hello."""
        if not peer.proved and message["kind"] != "hello":
            raise ValueError("a message before the hello")
        peer.heard = time.monotonic()
        if message["kind"] == "hello":
            if not peer.proved:
                peer.outgoing += self._announced
            peer.proved, peer.rank, peer.host = True, message["rank"], message["host"]
        elif message["kind"] == "report":
            self.reports[peer.rank] = (peer.heard, message)
            self._report_heard.notify_all()
        elif message["kind"] != "beat":
            self.messages.append((time.time(), peer.rank, message))
            peer.said_goodbye |= message["kind"] in ("done", "resizing")

    def _left(self, peer):
        """A rank's connection closed: its process ended (its exit status tells rrun the rest, from
        rrun's wrapper; where ranks run without it, one that said no goodbye failed)."""
        with self._lock:
            self._drop(peer)
        if self.on_gone is not None and not peer.said_goodbye and peer.proved:
            self.on_gone({"rank": peer.rank, "host": peer.host, "code": None, "time": time.time(), "stopped_by": None,
                          "last_error": None})

    def _send_all(self):
        with self._lock:
            for peer in list(self._peers.values()):
                if not peer.outgoing:
                    continue
                try:
                    sent = peer.socket.send(peer.outgoing)
                except BlockingIOError:
                    continue
                except OSError:
                    self._drop(peer)
                    continue
                peer.outgoing = peer.outgoing[sent:]

    def _check_silence(self, now):
        with self._lock:
            for stranger in [p for p in self._peers.values() if not p.proved and now - p.connected > AUTH_SECONDS]:
                self._drop(stranger)
            if self.timeout is None:
                return
            silent = [p for p in self._peers.values() if p.proved and now - p.heard > self.timeout]
            if not silent or self._silent_reported or self.supervisor is None:
                return
            self._silent_reported = True
            first = min(silent, key=lambda p: p.heard)
        self.supervisor.end(f"rank {first.rank} (on {first.host}) sent no heartbeat for {now - first.heard:.1f} s "
                            f"(--heartbeat-seconds {self.timeout:g}): its host is cut off or frozen", first.host)

    def _drop(self, peer):
        self._peers.pop(peer.socket, None)
        try:
            self._selector.unregister(peer.socket)
        except (KeyError, ValueError):
            pass
        peer.socket.close()


class _Peer:
    def __init__(self, connection, nonce):
        self.socket, self.nonce = connection, nonce
        self.proved = False  # it said a hello signed with the job's secret
        self.rank = self.host = None
        self.connected = self.heard = time.monotonic()
        self.received = b""
        self.outgoing = b""
        self.said_goodbye = False


def advertised_host(hosts):
    """The address of this machine that the ranks' hosts can reach: loopback where they are all
    this host, else the source address the kernel would use toward the first other host (a UDP
    socket's connect sends nothing), else this host's name."""
    here = {"localhost", socket.gethostname(), socket.getfqdn()}
    others = [h for h in hosts if h not in here and not h.startswith("127.")]
    if not others:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(others[0]), 9))
            return probe.getsockname()[0]
    except OSError:  # a host this machine cannot resolve or route to: its ranks say if they cannot reach rrun
        return socket.gethostname()
