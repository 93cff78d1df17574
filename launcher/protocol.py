"""What rrun and the ranks it starts tell each other.

rrun's per-rank wrapper sets WORLD_SIZE_VARIABLE for the rank, and each rank's end is
reported to rrun as one status line on stderr. A rank that fails with an uncaught
exception writes its own status line before it aborts the MPI job, because the MPI
process manager kills the wrappers the moment a rank aborts.
"""

import json
import os
import socket
import time

WORLD_SIZE_VARIABLE = "RRUN_WORLD_SIZE"
STATUS_PREFIX = b"@rrun-status "


def under_rrun():
    return WORLD_SIZE_VARIABLE in os.environ


def status_line(rank, code, last_error=None, stopped_by=None, left=None):
    """A report: the rank's exit status (negative: killed by that signal), its last error line,
    and the signal rrun's side sent it, if any (then its end is not a failure of its own). With
    `left` (what the others wait in), code 0: the rank is leaving while others wait for it, which
    is no failure by itself, but is to blame if the others then fail."""
    status = {
        "rank": rank, "host": socket.gethostname(), "code": code, "time": time.time(),
        "stopped_by": stopped_by, "last_error": last_error, "left": left,
    }
    return STATUS_PREFIX + json.dumps(status).encode() + b"\n"


def parse_status(line):
    """The report in a status line, or None for any other line."""
    if not line.startswith(STATUS_PREFIX):
        return None
    return json.loads(line[len(STATUS_PREFIX):])


# The link: a TCP connection from each rank to rrun, for jobs that need more than exit statuses
# (elastic jobs, and any job given --heartbeat-seconds). Both ends send a message at least every
# HEARTBEAT_SECONDS / 5; an end that hears nothing for HEARTBEAT_SECONDS takes the other for lost
# (a cut link, a frozen host: neither TCP nor MPI says so in time). Messages are JSON lines with a
# "kind": the ranks send hello (rank, host), beat, resumed (the commit and size a generation
# started from), resizing; rrun sends beat and hosts-updated.
LINK_VARIABLE = "RRUN_LINK"  # host:port of rrun's end
HEARTBEAT_VARIABLE = "RRUN_HEARTBEAT_SECONDS"
DEFAULT_HEARTBEAT_SECONDS = 30.0


def link_message(kind, **fields):
    return json.dumps({"kind": kind, **fields}).encode() + b"\n"


def parse_link_message(line):
    return json.loads(line)


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
