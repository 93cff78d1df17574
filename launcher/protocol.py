"""What rrun and the ranks it starts tell each other.

rrun's per-rank wrapper sets WORLD_SIZE_VARIABLE for the rank, and each rank's end is
reported to rrun as one status line on stderr. A rank that fails with an uncaught
exception writes its own status line before it aborts the MPI job, because the MPI
process manager kills the wrappers the moment a rank aborts.
"""

import hashlib
import hmac
import json
import os
import secrets
import socket
import time

WORLD_SIZE_VARIABLE = "RRUN_WORLD_SIZE"
STATUS_PREFIX = b"@rrun-status "
# rrun's per-rank wrapper reads the rank's output a line at a time, a longer one in pieces of this
# size (each then shown as a line), and rrun reads them with room for the wrapper's tag: no output
# holds either more memory than this.
MAX_OUTPUT_LINE = 1 << 20
MAX_TAGGED_LINE = MAX_OUTPUT_LINE + 256


def under_rrun():
    return WORLD_SIZE_VARIABLE in os.environ


def status_line(rank, code, last_error=None, stopped_by=None, left=None, environ=os.environ):
    """A report: the rank's exit status (negative: killed by that signal), its last error line,
    and the signal rrun's side sent it, if any (then its end is not a failure of its own). With
    `left` (what the others wait in), code 0: the rank is leaving while others wait for it, which
    is no failure by itself, but is to blame if the others then fail. Signed with the job's secret
    (after the prefix, as the link's lines are), so no line the program prints passes for one."""
    status = {
        "rank": rank, "host": socket.gethostname(), "code": code, "time": time.time(),
        "stopped_by": stopped_by, "last_error": last_error, "left": left,
    }
    payload = json.dumps(status).encode()
    return STATUS_PREFIX + _signature(environ.get(SECRET_VARIABLE, ""), "status", payload) + b" " + payload + b"\n"


def parse_status(line, secret):
    """The report in a status line signed with `secret`, or None for any other line (one the
    program printed, whatever it holds, is the program's output)."""
    if not line.startswith(STATUS_PREFIX) or not secret:
        return None
    signature, _, payload = line[len(STATUS_PREFIX):].rstrip(b"\n").partition(b" ")
    if not hmac.compare_digest(signature, _signature(secret, "status", payload)):
        return None
    return json.loads(payload)


# The link: a TCP connection from each rank to rrun, in every job rrun starts: the ranks' reports
# (flight records, figures), and for elastic jobs the notices of a resize. Both ends send a message
# at least every HEARTBEAT_SECONDS / 5; where the job has a heartbeat (elastic jobs, and any job
# given --heartbeat-seconds), an end that hears nothing for HEARTBEAT_SECONDS takes the other for
# lost (a cut link, a frozen host: neither TCP nor MPI says so in time). Messages are JSON lines with a
# "kind": rrun sends challenge (first, with the connection's nonce), beat, hosts-updated,
# rank-failed and report-now; the ranks send RANK_MESSAGES, each line signed: the HMAC-SHA256, under the job's
# secret, of the connection's nonce and the JSON, in hex, then a space, then the JSON. rrun checks
# the signature before it parses anything, so only the job's own ranks can say anything to it.
LINK_VARIABLE = "RRUN_LINK"  # host:port of rrun's end
HEARTBEAT_VARIABLE = "RRUN_HEARTBEAT_SECONDS"
DEFAULT_HEARTBEAT_SECONDS = 30.0
# The job's secret (hex), made by rrun and given to the ranks through mpiexec's environment only.
SECRET_VARIABLE = "RINGREDUCE_JOB_SECRET"
MAX_LINE_BYTES = 64 << 10  # a longer line is not a rank's: its connection is dropped
# What a rank may say, and the type of each field (rrun drops a connection that says anything else).
RANK_MESSAGES = {
    "hello": {"rank": int, "host": str, "pid": int},
    "beat": {},
    "resumed": {"commit": (int, type(None)), "size": int, "in_place": bool},
    "resizing": {},
    "committed": {},  # an elastic job's ranks made a commit (rank 0 says so)
    "done": {},
    # Each beat: the rank's flight records and its clock; its figures of the last minute where it
    # has them (rounds_per_second, wait_share, behind_seconds, bytes), which rrun checks.
    "report": {"records": list, "now": (int, float)},
}


def new_secret():
    return secrets.token_hex(32)


def link_message(kind, **fields):
    return json.dumps({"kind": kind, **fields}).encode() + b"\n"


def parse_link_message(line):
    return json.loads(line)


def _signature(secret, nonce, payload):
    """The HMAC-SHA256 under `secret` (hex) of `nonce` and `payload`, in hex (a blank secret signs
    nothing rrun accepts: rrun always has one)."""
    key = bytes.fromhex(secret) if secret else b""
    return hmac.new(key, nonce.encode() + b"\0" + payload, hashlib.sha256).hexdigest().encode()


def signed_link_message(secret, nonce, kind, **fields):
    """A rank's message on the connection that rrun challenged with `nonce`."""
    payload = json.dumps({"kind": kind, **fields}).encode()
    return _signature(secret, nonce, payload) + b" " + payload + b"\n"


def checked_rank_message(secret, nonce, line):
    """The message a rank's signed `line` carries; a ValueError saying why for anything else (a
    bad or missing signature, before the line is parsed; then JSON that is not RANK_MESSAGES')."""
    signature, _, payload = line.partition(b" ")
    if not hmac.compare_digest(signature, _signature(secret, nonce, payload)):
        raise ValueError("a line without the job's signature")
    try:
        message = json.loads(payload)
    except ValueError:
        raise ValueError("a signed line that is not JSON") from None
    fields = RANK_MESSAGES.get(message.get("kind")) if isinstance(message, dict) else None
    if fields is None:
        raise ValueError(f"an unknown message: {payload[:80]!r}")
    for name, kind in fields.items():
        value = message.get(name)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
            raise ValueError(f"a {message['kind']} message whose {name} is {value!r}")
    if message["kind"] == "hello" and (message["rank"] < 0 or len(message["host"]) > 255):
        raise ValueError(f"a hello naming rank {message['rank']} on host {message['host'][:80]!r}")
    return message


def beat_interval(timeout):
    """How often an end of the link sends a beat: five or more times in a timeout, at most ten
    times a second."""
    return max(0.1, min(1.0, timeout / 5))


# What rrun tells the ranks of an elastic job: its generation (0, then one more per resize or
# failure), an identifier that stays the same across generations, and where each host keeps the
# job's commits (the directory --commit-dir gives, else DEFAULT_COMMIT_DIR).
GENERATION_VARIABLE = "RINGREDUCE_ELASTIC_GENERATION"
JOB_VARIABLE = "RINGREDUCE_ELASTIC_JOB"
COMMIT_DIR_VARIABLE = "RINGREDUCE_COMMIT_DIR"
DEFAULT_COMMIT_DIR = "/dev/shm/ringreduce-commits-{job}"
# Set where the job's MPI can shrink it in place (ULFM): the survivors of a failure go on.
IN_PLACE_VARIABLE = "RINGREDUCE_ELASTIC_IN_PLACE"
