"""How the ranks agree, every cycle, which requests are ready on all of them, in one order.

Each cycle every rank contributes its RankState (wire.py): flags, and one bit per cached
request it has pending. Requests not in the cache are announced once, in full. Every rank
then runs this same pure logic on the same data, so all of them reach the same decisions
without a round trip to a coordinator: they all act as the coordinator. A request's
name is ready when every rank has submitted it (a rank that has joined stands in for an
allreduce with the op's identity); the ranks' submissions must agree, or every rank gets the
same error. The cache makes a training loop's steady state one bit per name and cycle.
"""

import collections
import dataclasses
import time

from ringreduce.engine import agreement
from ringreduce.engine.cache import Cache
from ringreduce.errors import DeadlockError, PeerExitedError, RingReduceError, StallError, ranks_text


@dataclasses.dataclass
class Entry:
    """A name some ranks have submitted and others not yet."""

    cycle: int  # the cycle it was first seen in
    messages: dict = dataclasses.field(default_factory=dict)  # rank -> Message
    arrival: dict = dataclasses.field(default_factory=dict)  # rank -> time its request was first seen
    warned: bool = False

    @property
    def kind(self):
        return next(iter(self.messages.values())).kind


@dataclasses.dataclass(frozen=True)
class Response:
    """A name every rank has submitted: run it with these messages (None: a joined rank), or fail."""

    name: str
    messages: tuple
    error: Exception | None = None
    # The first rank's message (None where every rank joined): asked for many times per response by
    # fusion and execution, so found once, when made (a cached_property's first call costs three
    # times the search, for its lock).
    message: agreement.Message | None = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "message", next(filter(None, self.messages), None))  # a Message is a tuple: true


@dataclasses.dataclass
class Outcome:
    responses: list
    join_done: int | None = None  # when every rank has joined: the rank that joined last
    all_shut_down: bool = False
    stall_warning: str | None = None


class Stragglers:
    """Per rank: in how many rounds it was the last to be ready, how long it kept the others, and
    over the last minute how much it waited and how far behind the first rank it came.

    Each rank measures how long it waited for the others inside a round (an engine cycle that ran
    something, or a plain call) and reports it in its next: the last rank to arrive waited least,
    and the others waited for it that much longer. Durations, unlike timestamps, need no clocks in
    agreement, and every rank records the same waits, so each can tell every rank's figures.
    """

    NOISE_SECONDS = 1e-4  # closer than this, nobody held anybody up
    WINDOW_SECONDS = 60

    def __init__(self, size):
        self.cycles = 0
        self.last = [0] * size
        self.waited = [0.0] * size
        # [second, rounds, sum of the first rank's wait, waited per rank]: how far a rank came behind
        # the first is the first's wait less its own, summed over the rounds
        self._seconds = collections.deque()

    def record(self, waits):
        """`waits`: every rank's wait in one round."""
        self.cycles += 1
        first, least = max(waits), min(waits)
        if first - least > self.NOISE_SECONDS:
            rank = waits.index(least)
            self.last[rank] += 1
            self.waited[rank] += first - least
        second = int(time.monotonic())
        seconds = self._seconds
        if not seconds or seconds[-1][0] != second:
            while seconds and seconds[0][0] <= second - self.WINDOW_SECONDS:
                seconds.popleft()
            seconds.append([second, 0, 0.0, [0.0] * len(waits)])
        bucket = seconds[-1]
        bucket[1] += 1
        bucket[2] += first
        waited = bucket[3]
        for rank, wait in enumerate(waits):
            waited[rank] += wait

    @classmethod
    def combined(cls, parts):
        """One record of several (the engine's cycles and the plain calls in program order)."""
        whole = cls(len(parts[0].last))
        by_second = {}
        for part in parts:
            whole.cycles += part.cycles
            whole.last = [a + b for a, b in zip(whole.last, part.last, strict=True)]
            whole.waited = [a + b for a, b in zip(whole.waited, part.waited, strict=True)]
            for second, rounds, firsts, waited in list(part._seconds):
                into = by_second.setdefault(second, [second, 0, 0.0, [0.0] * len(waited)])
                into[1] += rounds
                into[2] += firsts
                into[3] = [a + b for a, b in zip(into[3], waited, strict=True)]
        whole._seconds.extend(by_second[second] for second in sorted(by_second))
        return whole

    def report(self):
        """[(rank, share of rounds it was last in, mean seconds late when it was)], worst first."""
        rows = [(r, self.last[r] / self.cycles, self.waited[r] / self.last[r])
                for r in range(len(self.last)) if self.last[r]]
        return sorted(rows, key=lambda row: -row[1])

    def recent(self):
        """Over the last minute (or since the first round, if later), per rank: rounds per second,
        the share of the time it spent waiting for the others, and how far behind the first rank
        it came on average (seconds): (window seconds, [(rounds/s, wait share, behind)] by rank)."""
        now = time.monotonic()
        buckets = [b for b in list(self._seconds) if b[0] > now - self.WINDOW_SECONDS]
        if not buckets:
            return 0.0, [(0.0, 0.0, 0.0)] * len(self.last)
        span = max(now - buckets[0][0], 1.0)
        rounds = sum(b[1] for b in buckets)
        firsts = sum(b[2] for b in buckets)
        waited = [sum(b[3][r] for b in buckets) for r in range(len(self.last))]
        return span, [(rounds / span, wait / span, (firsts - wait) / rounds) for wait in waited]

    def table(self):
        """The report as rrun --straggler-report prints it at shutdown."""
        rows = self.report()
        lines = [f"ringreduce straggler report ({self.cycles} rounds ran collectives):"]
        lines += [f"  rank {rank} was last in {share:.0%} of rounds, {late * 1000:.1f} ms late on average"
                  for rank, share, late in rows]
        if not rows:
            lines.append("  no rank kept the others waiting")
        return "\n".join(lines)


class Negotiator:
    def __init__(self, size, cache_capacity, stall_check_seconds=60.0, stall_shutdown_seconds=None,
                 deadlock_seconds=0.0, ranks=None, where=""):
        """`ranks`: the ranks as the user knows them (a process set's global ranks), by index;
        `where` names the process set in messages (" in process set 1")."""
        self.size = size
        self.ranks = list(ranks) if ranks is not None else list(range(size))
        self.where = where
        self.deadlock_seconds = deadlock_seconds
        self._quiet_since = None  # since when, by this rank's clock, nothing arrived and nothing ran
        self.table = {}  # name -> Entry, in the order the names were first seen
        self.cache = Cache(cache_capacity)
        self.stall_check_seconds = stall_check_seconds
        self.stall_shutdown_seconds = stall_shutdown_seconds
        self.stragglers = Stragglers(size)
        self.cycles = 0
        self.cache_hits = 0  # names that became ready from cache bits alone
        self._joined_at = {}  # rank -> cycle in which it joined
        self._previous_ran_something = False

    def negotiate(self, states, announcements, now):
        """One cycle: every rank's RankState and newly announced Messages in, decisions out."""
        self.cycles += 1
        if self._previous_ran_something:
            self.stragglers.record([state.waited for state in states])
        if not self.table and _all_alike_and_cached(states, announcements):
            self._quiet_since = now
            return self._cached_outcome(states[0].slots)
        arrived = False
        for rank, state in enumerate(states):
            for slot in state.slots:
                cached = self.cache.entry(slot)
                arrived |= self._arrive(cached.name, rank, cached.messages[rank], now)
        for rank, messages in enumerate(announcements):
            for message in messages:
                self.cache.forget_announced(message.name)
                arrived |= self._arrive(message.name, rank, message, now)
        joined = {rank for rank, state in enumerate(states) if state.joined}
        leaving = sorted(rank for rank, state in enumerate(states) if state.shutting_down)
        for rank in joined:
            self._joined_at.setdefault(rank, self.cycles)
        gpu_taken = any(state.gpu_taken for state in states)

        responses = []
        for name, entry in list(self.table.items()):
            response = self._decide(name, entry, joined, leaving, gpu_taken)
            if response is None:
                continue
            del self.table[name]
            responses.append(response)
        self._previous_ran_something = any(r.error is None for r in responses)

        outcome = Outcome(responses, all_shut_down=len(leaving) == self.size)
        if responses or arrived or not self.table or self._quiet_since is None:
            self._quiet_since = now
        elif all(state.deadlocked for state in states):
            self._fail_deadlock(outcome, joined)
        if len(joined) == self.size:
            outcome.join_done = max(self._joined_at, key=lambda r: (self._joined_at[r], r))
            self._joined_at.clear()
        if any(state.stalled for state in states):
            self._fail_stalled(outcome, now)
        outcome.stall_warning = self._stall_warning(now)
        return outcome

    def _cached_outcome(self, slots):
        """The steady state's decision, the same as the general path reaches: every rank has the
        same cached requests pending and nothing else to say, so all of them run, in slot order."""
        responses = [self._cache_hit(self.cache.entry(slot)) for slot in slots]
        self._previous_ran_something = bool(responses)
        return Outcome(responses)

    def _cache_hit(self, response):
        """A cached response whose messages all came as cache bits: agreed when cached."""
        self.cache.touch(response.name)
        self.cache_hits += 1
        return response

    def stall_due(self, now):
        """True when, by this rank's clock, a request has waited past the stall shutdown time.
        The rank says so in its row, and every rank then fails the same requests together."""
        return self.stall_shutdown_seconds is not None and any(
            now - min(e.arrival.values()) >= self.stall_shutdown_seconds for e in self.table.values())

    def deadlock_suspected(self, now):
        """True when, by this rank's clock, requests have waited the deadlock time with nothing new
        submitted anywhere. A rank blocked in a wait says so in its row; when every rank does,
        every rank fails the same requests together."""
        return bool(self.deadlock_seconds and self.table) and now - self._quiet_since >= self.deadlock_seconds

    def _arrive(self, name, rank, message, now):
        """Record `rank`'s message for `name`; True when it is new (not seen in an earlier cycle)."""
        entry = self.table.get(name)
        if entry is None:
            entry = self.table[name] = Entry(self.cycles)
        new = rank not in entry.messages
        entry.messages[rank] = message
        entry.arrival.setdefault(rank, now)
        return new

    def _decide(self, name, entry, joined, leaving, gpu_taken):
        """The Response for `name` this cycle, or None while it waits: for a rank (or for a turn on a
        rank's GPU, `gpu_taken`, where it would run on the GPU)."""
        missing = [r for r in range(self.size) if r not in entry.messages]
        title = f"{entry.kind} {name!r}{self.where}"
        if leaving:
            waiting = sorted(entry.messages)
            sites = agreement.called_at([entry.messages[r] for r in waiting], [self.ranks[r] for r in waiting])
            return self._fail(name, entry, PeerExitedError(
                f"{self._text(leaving)} shut down while {self._text(waiting)} waited in {title}{sites}; "
                "every rank must make the same collective calls"))
        if any(r not in joined for r in missing):
            return None
        if missing and entry.kind != "allreduce":
            return self._fail(name, entry, RingReduceError(
                f"{title} cannot run: {self._text(missing)} called join(); only allreduce goes on "
                "while ranks are joining"))
        messages = tuple(entry.messages.get(r) for r in range(self.size))
        cached = None if missing else self.cache.cached(name, messages)
        if cached is not None:
            return None if gpu_taken and _on_gpu(messages) else self._cache_hit(cached)
        error = agreement.disagreement([m for m in messages if m is not None],
                                       [self.ranks[r] for r in range(self.size) if messages[r] is not None], self.where)
        if error is None and gpu_taken and _on_gpu(messages):
            return None
        response = Response(name, messages, error)
        if error is None and not missing:
            self.cache.remember(response)
        return response

    def _fail(self, name, entry, error):
        return Response(name, tuple(entry.messages.get(r) for r in range(self.size)), error)

    def _stall_warning(self, now):
        """The warning for requests waiting past the stall check time, each named once."""
        fresh = [(name, entry) for name, entry in self.table.items()
                 if not entry.warned and now - min(entry.arrival.values()) >= self.stall_check_seconds]
        if not fresh:
            return None
        for _, entry in fresh:
            entry.warned = True
        return "ringreduce stall: some ranks wait for requests that others have not submitted:\n  " + \
            "\n  ".join(self._describe_stall(name, entry, now) for name, entry in fresh)

    def _fail_stalled(self, outcome, now):
        """Fail every request that was already waiting before this cycle, on every rank alike."""
        stalled = [(name, entry) for name, entry in self.table.items() if entry.cycle < self.cycles]
        if not stalled:
            return
        error = StallError(" / ".join(self._describe_stall(name, entry, now) for name, entry in stalled)
                           + f" (RINGREDUCE_STALL_SHUTDOWN_TIME={self.stall_shutdown_seconds:g})")
        for name, entry in stalled:
            del self.table[name]
            outcome.responses.append(self._fail(name, entry, error))

    def _fail_deadlock(self, outcome, joined):
        """Every rank is blocked, each waiting for requests that others have not submitted: fail all
        of them, on every rank alike, naming what each rank waits for."""
        waits = []
        for rank in range(self.size):
            names = [entry.messages[rank].described() for entry in self.table.values() if rank in entry.messages]
            waits.append(f"{self._text([rank])} waits " + (
                "in " + ", ".join(names) if names else "in join()" if rank in joined
                else "elsewhere (in a plain call, a collective of another process set or a recv)"))
        error = DeadlockError(
            f"deadlock{self.where}: every rank has been blocked for {self.deadlock_seconds:g} s with nothing new "
            f"submitted anywhere: {'; '.join(waits)}. Every rank must make the same collective calls "
            "(RINGREDUCE_DEADLOCK_TIME sets how long to wait, 0 never)")
        for name, entry in list(self.table.items()):
            del self.table[name]
            outcome.responses.append(self._fail(name, entry, error))

    def _describe_stall(self, name, entry, now):
        missing = [r for r in range(self.size) if r not in entry.messages]
        first = entry.messages[min(entry.messages)]
        return (f"{first.described(self.where)}: submitted by {self._text(sorted(entry.messages))} "
                f"{now - min(entry.arrival.values()):.0f} s ago, still missing from {self._text(missing)}")

    def _text(self, indices):
        """'rank 3' or 'ranks 0, 2': ranks of this domain by index, named as the user knows them."""
        return ranks_text([self.ranks[i] for i in indices])


def _all_alike_and_cached(states, announcements):
    """Nothing but the same cache bits on every rank: no announcement, join, shutdown or stall."""
    first = states[0].slots
    return not any(announcements) and all(state.only_slots and state.slots == first for state in states)


def _on_gpu(messages):
    """Would this collective run on the GPU (on any rank: every rank's agree once checked)?"""
    return any(message is not None and message.device == "cuda" for message in messages)
