"""rrun's end of the link to the ranks (ringreduce.launcher.protocol): a server the ranks connect
to at init. It beats to every rank, passes on notices (hosts-updated), records what the ranks say
(which host each runs on, the commit a generation resumed from), and reports a rank that has been
silent for the heartbeat timeout: its host froze or its link was cut, which neither TCP nor MPI
says in time."""

import selectors
import socket
import threading
import time

from ringreduce.launcher import protocol


class LinkServer:
    def __init__(self, timeout):
        self.timeout = timeout
        self.supervisor = None  # the Supervisor of the job running now, which a silent rank ends
        self.on_gone = None  # where ranks run without rrun's wrapper: told of a rank that left without a word
        self._listener = socket.create_server(("", 0))
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._peers = {}  # socket -> _Peer
        self._announced = b""  # the notices every rank of the job watched now must hear (announce)
        self._closed = threading.Event()
        self.messages = []  # (time, rank, message) of the ranks' messages other than beats
        self._silent_reported = False
        self._thread = threading.Thread(target=self._serve, name="rrun-link", daemon=True)
        self._thread.start()

    def env(self, hosts):
        """The variables that tell ranks on `hosts` where rrun's end is, and the timeout."""
        address = f"{advertised_host(hosts)}:{self._listener.getsockname()[1]}"
        return {protocol.LINK_VARIABLE: address, protocol.HEARTBEAT_VARIABLE: str(self.timeout)}

    def watch(self, supervisor):
        """Watch the ranks of `supervisor`'s job from now on: the last job's connections are closed
        (any rank of it still alive ends itself), and a silent rank ends this job."""
        with self._lock:
            for peer in list(self._peers.values()):
                self._drop(peer)
            self.supervisor, self._silent_reported, self._announced = supervisor, False, b""

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
            peer.outgoing += message

    def ranks(self):
        """{rank: host} of the ranks connected now."""
        with self._lock:
            return {p.rank: p.host for p in self._peers.values() if p.rank is not None}

    def close(self):
        self._closed.set()
        self._thread.join()
        with self._lock:
            for peer in list(self._peers.values()):
                self._drop(peer)
        self._selector.close()
        self._listener.close()

    def _serve(self):
        interval = protocol.beat_interval(self.timeout)
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
        connection.setblocking(False)
        peer = _Peer(connection)
        with self._lock:
            peer.outgoing = self._announced
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
            peer.heard = time.monotonic()
            *lines, peer.received = (peer.received + data).split(b"\n")
            for line in lines:
                message = protocol.parse_link_message(line)
                if message["kind"] == "hello":
                    peer.rank, peer.host = message["rank"], message["host"]
                elif message["kind"] != "beat":
                    self.messages.append((time.time(), peer.rank, message))
                    peer.said_goodbye |= message["kind"] in ("done", "resizing")

    def _left(self, peer):
        """A rank's connection closed: its process ended (its exit status tells rrun the rest, from
        rrun's wrapper; where ranks run without it, one that said no goodbye failed)."""
        with self._lock:
            self._drop(peer)
        if self.on_gone is not None and not peer.said_goodbye and peer.rank is not None:
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
            silent = [p for p in self._peers.values() if now - p.heard > self.timeout]
            if not silent or self._silent_reported or self.supervisor is None:
                return
            self._silent_reported = True
            first = min(silent, key=lambda p: p.heard)
        who = "a rank that never said which" if first.rank is None else f"rank {first.rank} (on {first.host})"
        self.supervisor.end(f"{who} sent no heartbeat for {now - first.heard:.1f} s "
                            f"(--heartbeat-seconds {self.timeout:g}): its host is cut off or frozen", first.host)

    def _drop(self, peer):
        self._peers.pop(peer.socket, None)
        try:
            self._selector.unregister(peer.socket)
        except (KeyError, ValueError):
            pass
        peer.socket.close()


class _Peer:
    def __init__(self, connection):
        self.socket = connection
        self.rank = self.host = None
        self.heard = time.monotonic()
        self.received = b""
        self.outgoing = b""
        self.said_goodbye = False


def advertised_host(hosts):
    """The address of this machine that the ranks' hosts can reach: loopback where they are all
    this host, else the source address the kernel would use toward the first other host (a UDP
    socket's connect sends nothing)."""
    here = {"localhost", socket.gethostname(), socket.getfqdn()}
    others = [h for h in hosts if h not in here and not h.startswith("127.")]
    if not others:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(others[0]), 9))
        return probe.getsockname()[0]
