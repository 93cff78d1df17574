"""Each rank's last collectives, kept so that a job that hangs, fails or crawls can say what every
rank was doing: rrun collects them over its link (`--flight-recorder N`, `rrun --dump`).

Recording one is a deque append of a small object at submission; the time it finished comes
from its handle, read only when the records are asked for, so a collective pays nothing more."""

import collections
import itertools
import time

DEFAULT_CAPACITY = 32


class Flight:
    """One collective as this rank made it."""

    __slots__ = ("seq", "message", "set_id", "site", "submitted", "handle", "done")

    def __init__(self, seq, message, set_id, handle, site):
        self.seq, self.message, self.set_id, self.site, self.submitted = seq, message, set_id, site, time.time()
        self.handle, self.done = handle, None


class FlightRecorder:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._flights: collections.deque = collections.deque(maxlen=capacity)
        self._numbers = itertools.count()

    def record(self, message, set_id, handle=None, site=None) -> Flight:
        """A collective submitted now; `handle` tells when it finished (None: the caller marks it
        with finished()). `site`: where it was called, where the message (one checked before,
        reused) says another place."""
        flight = Flight(next(self._numbers), message, set_id, handle, site or message.site)
        self._flights.append(flight)
        return flight

    @staticmethod
    def finished(flight: Flight) -> None:
        flight.done = time.time()

    def snapshot(self, missing_ranks=None) -> list[dict]:
        """Every record kept, oldest first, as plain data. `missing_ranks(set_id, name)` names the
        ranks that have not submitted a collective still in flight (None where unknown)."""
        records = []
        for flight in list(self._flights):  # the deque may grow under us: a copy first
            done = flight.done
            if done is None and flight.handle is not None and flight.handle.done():
                done = flight.done = flight.handle.finished_at
            message = flight.message
            record = {"seq": flight.seq, "kind": message.kind, "name": message.name[:120],
                      "shape": list(message.shape), "dtype": message.dtype, "site": flight.site,
                      "set": flight.set_id, "submitted": flight.submitted, "done": done}
            if done is None and missing_ranks is not None:
                record["waiting_for"] = missing_ranks(flight.set_id, message.name)
            records.append(record)
        return records

    def last_seq(self) -> int:
        """The number of the newest record (-1 before any): with the count of finished ones, what
        tells a sender whether anything changed."""
        return self._flights[-1].seq if self._flights else -1
