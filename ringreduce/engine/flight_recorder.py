"""Each rank's last collectives, kept so that a job that hangs, fails or crawls can say what every
rank was doing: rrun collects them over its link (`--flight-recorder N`, `rrun --dump`).

Recording one costs a list and a deque append at submission (about 0.2 us); its handle marks it
done (the record holds no handle: a kept handle would keep its result's memory from being reused),
and its call site is read from its caller's code only when the records are asked for."""

import collections
import itertools
import time

from ringreduce.engine.call_sites import site_of

DEFAULT_CAPACITY = 32
# A record: [number, Message, process set id, (caller's code, line) or None, submitted, done]


class FlightRecorder:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._flights: collections.deque = collections.deque(maxlen=capacity)
        self._numbers = itertools.count()

    def record(self, message, set_id, caller=None) -> list:
        """A collective submitted now, done once finished() or its handle (started_as) says so.
        `caller`: the (code, line) that called it, where the message (one checked before, reused)
        may name another place."""
        flight = [next(self._numbers), message, set_id, caller, time.time(), None]
        self._flights.append(flight)
        return flight

    @staticmethod
    def finished(flight: list) -> None:
        flight[-1] = time.time()

    @staticmethod
    def started_as(flight: list, handle) -> None:
        """The collective went on to the engine: `handle` marks it done when the engine finishes it."""
        handle.flight = flight

    def snapshot(self, missing_ranks=None) -> list[dict]:
        """Every record kept, oldest first, as plain data. `missing_ranks(set_id, name)` names the
        ranks that have not submitted a collective still in flight (None where unknown)."""
        records = []
        for seq, message, set_id, caller, submitted, done in list(self._flights):  # a copy: it grows
            site = (site_of(*caller) if caller else None) or message.site
            record = {"seq": seq, "kind": message.kind, "name": message.name[:120], "shape": list(message.shape),
                      "dtype": message.dtype, "site": site, "set": set_id, "submitted": submitted, "done": done}
            if done is None and missing_ranks is not None:
                record["waiting_for"] = missing_ranks(set_id, message.name)
            records.append(record)
        return records
