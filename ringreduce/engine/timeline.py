"""A Chrome trace of the engine's work (open it in Perfetto or chrome://tracing): one row per
tensor with its phases, and a mark for each cycle that did work.

Events are written as they end, one per line in a JSON array whose closing bracket comes at
shutdown; the trace viewers accept the array without it, so a killed job's file still opens.
The engine thread and the callers' plain calls in program order both write: one at a time.
"""

import json
import os
import threading
import time


class Timeline:
    recording = True

    def __init__(self, path, rank, mark_cycles=True):
        # Not through a link: in a shared folder such as /tmp, another user's link at this name would
        # have the job overwrite whatever it points to.
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        except OSError as error:
            raise OSError(error.errno, f"the timeline {path}: {error.strerror}"
                          + (" (it is a symbolic link, which the timeline does not follow)"
                             if os.path.islink(path) else "")) from None
        self._file = os.fdopen(descriptor, "w")
        self._mark_cycles = mark_cycles
        self._rank = rank
        self._start = time.perf_counter()
        self._rows = {}
        self._first = True
        self._lock = threading.Lock()
        self._write({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})

    def phase(self, tensor, phase, start, end, flush=False):
        """One phase of a tensor's; `flush` where no cycle mark follows to flush it."""
        with self._lock:
            row = self._rows.get(tensor)
            if row is None:
                row = self._rows[tensor] = len(self._rows) + 1
                self._write({"name": "thread_name", "ph": "M", "pid": self._rank, "tid": row,
                             "args": {"name": tensor}})
            self._write({"name": phase, "ph": "X", "pid": self._rank, "tid": row, "ts": self._us(start),
                         "dur": max(self._us(end) - self._us(start), 0.0), "args": {"tensor": tensor}})
            if flush:
                self._file.flush()

    def cycle(self, number, start, tensors, collectives):
        with self._lock:
            if self._mark_cycles:
                self._write({"name": "CYCLE", "ph": "i", "s": "p", "pid": self._rank, "tid": 0,
                             "ts": self._us(start),
                             "args": {"cycle": number, "tensors": tensors, "collectives": collectives}})
            self._file.flush()

    def close(self):
        with self._lock:
            self._file.write("\n]\n")
            self._file.close()

    def _us(self, moment):
        return round((moment - self._start) * 1e6, 1)

    def _write(self, event):
        self._file.write(("[\n" if self._first else ",\n") + json.dumps(event))
        self._first = False


class NoTimeline:
    """Stands in when no timeline was asked for."""

    recording = False  # callers may skip gathering what they would record

    def phase(self, tensor, phase, start, end, flush=False):
        pass

    def cycle(self, number, start, tensors, collectives):
        pass

    def close(self):
        pass
