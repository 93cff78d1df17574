"""rrun's link (launcher/link.py) against what a stranger on its port can send: it keeps serving
the job's real ranks, counts no stranger as a rank, never ends the job for one, and holds no
more of a stranger's bytes than a line's bound. The ranks' end is played by a socket that signs
its lines as ringreduce/resilience/rrun_link.py does."""

import json
import resource
import socket
import threading
import time

import pytest

from ringreduce.launcher import link, protocol

SECRET = protocol.new_secret()


class EndingSupervisor:
    """Stands in for the Supervisor, which a silent rank ends."""

    def __init__(self):
        self.ended = []

    def end(self, message, host):
        self.ended.append(message)


@pytest.fixture
def server():
    server = link.LinkServer(timeout=1.0, secret=SECRET)
    supervisor = EndingSupervisor()
    server.watch(supervisor)
    yield server, supervisor
    server.close()


def connect(server):
    host, port = server.env(["localhost"])[protocol.LINK_VARIABLE].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def challenge(connection):
    received = b""
    while b"\n" not in received:
        received += connection.recv(4096)
    message = json.loads(received.split(b"\n")[0])
    assert message["kind"] == "challenge"
    return message["nonce"]


class Rank:
    """A real rank: answers the challenge with a signed hello, then beats."""

    def __init__(self, server, rank=0):
        self.connection = connect(server)
        self.nonce = challenge(self.connection)
        self.say("hello", rank=rank, host="localhost", pid=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def say(self, kind, **fields):
        self.connection.sendall(protocol.signed_link_message(SECRET, self.nonce, kind, **fields))

    def _beat(self):
        while not self._stop.wait(0.1):
            self.say("beat")

    def close(self):
        self._stop.set()
        self._thread.join()
        self.connection.close()


def closed_by_server(connection, seconds=5.0):
    """Whether the server closes `connection` within `seconds` (what it sends meanwhile is read)."""
    connection.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if not connection.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


STRANGER_LINES = [
    b"not json at all\n",
    b"[1, 2, 3]\n",
    b'{"kind": "done"}\n',  # unsigned: would make a failed generation end with status 0
    b'{"kind": "hello", "rank": 1, "host": "hostb", "pid": 7}\n',  # unsigned: would set hostb aside
    b"0" * 64 + b' {"kind": "hello", "rank": 1, "host": "hostb", "pid": 7}\n',  # a forged signature
]


@pytest.mark.parametrize("line", STRANGER_LINES, ids=["garbage", "not-an-object", "done", "hello", "bad-hmac"])
def test_a_stranger_s_line_drops_its_connection_and_nothing_else(server, line):
    server, supervisor = server
    rank = Rank(server)
    try:
        stranger = connect(server)
        challenge(stranger)
        stranger.sendall(line)
        assert closed_by_server(stranger)
        time.sleep(1.5)  # past the heartbeat timeout: the real rank beats, and is the only rank
        assert server.ranks() == {0: "localhost"}
        assert server.messages == [] and supervisor.ended == []
    finally:
        rank.close()


def test_a_signed_message_that_is_not_a_rank_s_drops_the_connection(server):
    """A resumed without its fields crashed rrun's main thread; a kind rrun does not know, and a
    message before the hello, are not a rank's either."""
    server, supervisor = server
    for kind, fields in [("resumed", {}), ("exit-everything", {}), ("done", None)]:
        connection = connect(server)
        nonce = challenge(connection)
        if fields is not None:
            connection.sendall(protocol.signed_link_message(SECRET, nonce, "hello", rank=0, host="h", pid=1))
        connection.sendall(protocol.signed_link_message(SECRET, nonce, kind, **(fields or {})))
        assert closed_by_server(connection), kind
    assert server.messages == [] and supervisor.ended == []


def test_a_line_without_end_is_cut_off_at_the_bound(server):
    server, _ = server
    stranger = connect(server)
    challenge(stranger)
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        for _ in range(10 * 16):  # 10 MiB, 64 KiB at a time, no newline
            stranger.sendall(b"x" * (64 << 10))
    assert server.ranks() == {}


def test_thousands_of_strangers_are_dropped_and_never_end_the_job(server):
    """Before, a silent connection counted as a silent rank: the job ended after the heartbeat
    timeout, and every connection was kept, with all it sent. Now the oldest strangers make room
    for new ones (the server holds at most MAX_STRANGERS of them, each at most a line's bound),
    and a real rank that connects meanwhile is served."""
    server, supervisor = server
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8192)), hard))
    count = min(2000, (resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256) // 2)
    strangers = []
    try:
        for _ in range(count):
            stranger = connect(server)
            stranger.sendall(b"y" * 1000)  # no newline: held until the line's bound
            strangers.append(stranger)
        rank = Rank(server, rank=3)
        time.sleep(0.5)
        held = [p for p in list(server._peers.values()) if not p.proved]
        assert len(held) <= link.MAX_STRANGERS and sum(len(p.received) for p in held) <= 1000 * link.MAX_STRANGERS
        time.sleep(link.AUTH_SECONDS + 1.0)
        assert server.ranks() == {3: "localhost"} and supervisor.ended == []
        assert all(closed_by_server(s, seconds=1.0) for s in strangers[-10:])
        rank.close()
    finally:
        for stranger in strangers:
            stranger.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_real_rank_that_goes_silent_still_ends_the_job(server):
    server, supervisor = server
    rank = Rank(server, rank=1)
    rank._stop.set()
    time.sleep(2.0)
    assert supervisor.ended and supervisor.ended[0].startswith("rank 1 (on localhost) sent no heartbeat")
    rank.connection.close()


def test_the_signature_covers_the_connection_s_nonce():
    """A line signed for one connection is refused on another (a replay)."""
    line = protocol.signed_link_message(SECRET, "nonce-a", "done").rstrip(b"\n")
    assert protocol.checked_rank_message(SECRET, "nonce-a", line) == {"kind": "done"}
    with pytest.raises(ValueError, match="signature"):
        protocol.checked_rank_message(SECRET, "nonce-b", line)
    with pytest.raises(ValueError, match="signature"):
        protocol.checked_rank_message(protocol.new_secret(), "nonce-a", line)


def test_the_link_listens_on_the_address_it_gives_the_ranks():
    """Ranks all on this host are given loopback: the port is not open to the network."""
    local = link.LinkServer(timeout=1.0, secret=SECRET, hosts=["localhost"])
    try:
        assert local._listener.getsockname()[0] == "127.0.0.1"
        assert local.env(["localhost"])[protocol.LINK_VARIABLE].startswith("127.0.0.1:")
    finally:
        local.close()
