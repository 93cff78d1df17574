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
