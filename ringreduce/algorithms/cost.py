"""What each collective costs under each algorithm family, and the choice that follows from it.

The alpha-beta-gamma model: a message costs alpha (the MPI library's latency plus the Python
that posts and waits for it) plus beta per byte over its link (between processes of one host, or
across hosts); a reduction costs gamma per byte combined; each family has a fixed cost per call
(its Python around the messages). Two facts of real machines are in it too, because without them
no one set of parameters predicts both 64 KiB and 256 MiB: per-byte costs are several times lower
while the working set fits the last-level cache than when it streams from memory, and ranks beyond
a host's cores share them, so the host-side work of each slows by ceil(local ranks / cores). A link
across hosts is shared by the ranks of a host that cross it at the same time.

The numbers come from a Profile: measured on the job's machines (planning/calibration.py, `rrun
--calibrate`, saved by planning/profiles.py), or the one measured on the 2-core machine the project
is tested on (DEFAULT).
"""

import dataclasses
import json
import math

COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast")
# The sizes the choice is made at: every power of two up to 16 GiB.
TABLE_SIZES = [1 << i for i in range(35)]


@dataclasses.dataclass(frozen=True)
class PerByte:
    """Seconds per byte while the working set fits the last-level cache, and once it streams from memory."""

    cache: float
    memory: float

    def at(self, working_set, cache_bytes):
        """The cost per byte for a working set of this many bytes: the share of it beyond the
        cache costs as memory."""
        beyond = max(0.0, 1.0 - cache_bytes / working_set) if working_set > 0 else 0.0
        return self.cache + (self.memory - self.cache) * beyond


@dataclasses.dataclass(frozen=True)
class Link:
    alpha: float  # seconds per message
    beta: PerByte  # seconds per byte, one message at a time
    # Seconds per byte while both ranks of a pair send and receive at once (the ring's and the
    # halving's steps): memory is shared; None where not measured (as beta).
    exchange: PerByte | None = None
    # Seconds per message when two ranks share one core (None: as alpha): a rank that waits for a
    # message holds the core its partner needs, until the scheduler moves on.
    crowded_alpha: float | None = None
    # Seconds per byte more while a message's data, just combined or received by its sender, is
    # still in that core's private cache and the receiving core must fetch it from there (see
    # Model._in_core); None where not measured.
    fresh: float | None = None

    @classmethod
    def from_dict(cls, fields):
        per_byte = {k: PerByte(**fields[k]) if fields.get(k) else None for k in ("beta", "exchange")}
        return cls(**{**fields, **per_byte})


@dataclasses.dataclass(frozen=True)
class Profile:
    host: Link  # ringreduce's point-to-point messages between processes of one host
    network: Link | None  # the same across hosts (None: not measured, one host)
    mpi: Link  # the MPI library's own collectives: its messages, and its cost per byte on one host
    combine: PerByte  # gamma: reducing one array into another
    copy: PerByte  # copying, for the shared-memory family
    barrier: float  # one barrier of the shared segment
    calls: dict  # family -> fixed seconds per call
    cache_bytes: int  # the last-level cache of a host
    cores: int  # per host
    core_cache_bytes: int = 0  # a core's private cache (its L2): where Link.fresh applies; 0: unknown
    shm_piece_bytes: int = 1 << 20  # the shared-memory family's piece per rank (RINGREDUCE_SHM_PIECE_BYTES)
    # Seconds per byte more when a rank reads what another rank's core has just written into the
    # shared segment (its cache lines move between the cores' private caches); not crowded: the
    # lines move whichever process a core runs. 0: not measured.
    shm_handover: float = 0.0
    source: str = "built in"

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text, source=None):
        fields = json.loads(text)
        links = {k: Link.from_dict(v) if v else None for k, v in fields.items() if k in ("host", "network", "mpi")}
        per_byte = {k: PerByte(**fields[k]) for k in ("combine", "copy")}
        rest = {k: v for k, v in fields.items() if k not in links and k not in per_byte}
        profile = cls(**links, **per_byte, **rest)
        return dataclasses.replace(profile, source=source) if source else profile


@dataclasses.dataclass(frozen=True)
class JobShape:
    """A job as the model sees it: ranks spread evenly over hosts, consecutive ranks on one host."""

    ranks: int
    hosts: int = 1
    homogeneous: bool = True

    @property
    def local(self):
        return math.ceil(self.ranks / self.hosts)


# What a job uses until a profile of its own machines is saved: the 2-core test machine (AMD EPYC,
# 2 MiB L2 per core, 32 MiB of L3 for the arrays, MPICH 5.0.2) as `rrun -np 2 --calibrate` measures
# it, the median of three runs (docs/performance.md says when; docs/cost_model.md how).
DEFAULT = Profile(
    host=Link(1.83e-6, PerByte(1 / 6.67e9, 1 / 5.66e9), PerByte(1 / 8.90e9, 1 / 4.73e9), crowded_alpha=9.0e-6,
              fresh=0.145e-9),
    network=None,
    mpi=Link(1.29e-6, PerByte(1 / 6.67e9, 1 / 5.66e9), PerByte(1 / 2.63e9, 1 / 2.06e9), crowded_alpha=3.7e-6),
    combine=PerByte(1 / 13.23e9, 1 / 7.93e9),
    copy=PerByte(1 / 13.56e9, 1 / 5.95e9),
    barrier=1.57e-6,
    calls={"ring": 10.1e-6, "halving_doubling": 10.9e-6, "tree": 7.0e-6, "mpi": 1.2e-6, "shm": 10.1e-6,
           "hierarchical": 10.1e-6},
    cache_bytes=32 << 20,
    cores=2,
    core_cache_bytes=2 << 20,
)
# Across hosts when the profile has no measurement of it (calibrated on one host): 10 Gbit/s
# Ethernet through TCP, about 25 us a message. `rrun --calibrate` across the job's hosts replaces it.
ASSUMED_NETWORK = Link(25e-6, PerByte(8e-10, 8e-10))


class Model:
    """Predicted seconds of each collective under each family, for one Profile and JobShape."""

    def __init__(self, profile, shape, active=None):
        """`active`: the ranks per host at work at once, if fewer than all of them."""
        self.p, self.shape = profile, shape
        # Collectives go in lock step: each phase ends when the busiest core has run all of its
        # ranks' shares, so 3 ranks on 2 cores take as long as 4.
        self.crowding = max(1, math.ceil((active or shape.local) / profile.cores))

    # --- the pieces every family is made of

    def _send(self, nbytes, across, working_set, sharing=1, link=None, exchange=False):
        """One message of `nbytes`: over the network when `across` (its bandwidth shared by
        `sharing` ranks of the host sending at once), else between processes of the host; with
        `exchange`, every rank sends one and receives one at the same time."""
        link = link or self.p.host
        per_byte = link.exchange if exchange and link.exchange else link.beta
        host_side = nbytes * per_byte.at(working_set, self.p.cache_bytes) * self.crowding
        if across:  # the bytes still leave through the sender's memory, and arrive in the receiver's
            net = self.p.network or ASSUMED_NETWORK
            return net.alpha + nbytes * net.beta.memory * sharing + host_side
        # Exchanges only, as the probe measures it (a ping-pong's beta already sends back what it
        # has just received); not multiplied by the crowding (times the crowding, 3 ranks on 2
        # cores came out worse than without the term: 35 against 41 of 78 cases; docs/cost_model.md).
        fresh = nbytes * link.fresh * self._in_core(nbytes) if link.fresh and exchange else 0.0
        return self._latency(link) + host_side + fresh

    def _in_core(self, nbytes):
        """The share of a message that another core must fetch from its sender's private cache:
        all of it while eight such messages fit that cache, none once only two do, and in between
        by the logarithm of the size (measured on the test VM, 2 MiB per core: the whole penalty
        at 32-256 KiB, half at 512 KiB, none from 1 MiB; docs/cost_model.md)."""
        if not self.p.core_cache_bytes or nbytes <= 0:
            return 0.0
        return min(1.0, max(0.0, (math.log2(self.p.core_cache_bytes / nbytes) - 1) / 2))

    def _latency(self, link):
        """A message's latency: alpha, rising towards crowded_alpha as the ranks per core go from 1 to 2."""
        if link.crowded_alpha is None:
            return link.alpha * self.crowding
        return link.alpha + (link.crowded_alpha - link.alpha) * min(1.0, self.crowding - 1.0)

    def _barrier(self):
        """One barrier of the shared segment: crowded ranks wait for each other as messages do."""
        return self.p.barrier + self._latency(self.p.host) - self.p.host.alpha

    def _combine(self, nbytes, working_set):
        return nbytes * self.p.combine.at(working_set, self.p.cache_bytes) * self.crowding

    def _copy(self, nbytes, working_set):
        return nbytes * self.p.copy.at(working_set, self.p.cache_bytes) * self.crowding

    def _working_set(self, nbytes, factor=2.0):
        return self.shape.local * nbytes * factor

    # --- allreduce

    def allreduce(self, family, n):
        return self.p.calls.get(family, 0.0) + getattr(self, "_allreduce_" + family)(n)

    def _allreduce_ring(self, n):
        p = self.shape.ranks
        if p == 1:
            return 0.0
        ws, across, m = self._working_set(n), self.shape.hosts > 1, n / p
        return 2 * (p - 1) * self._send(m, across, ws, exchange=True) + (p - 1) * self._combine(m, ws)

    def _allreduce_halving_doubling(self, n, link=None):
        """Where the rank count is not a power of two, ringreduce's ranks that sit a phase out
        sleep through it and leave the cores to the ranks at work; MPI's own (`link`) spin."""
        p, k = self.shape.ranks, self.shape.local
        if p == 1:
            return 0.0
        width = 1 << (p.bit_length() - 1)
        ws = self._working_set(n)
        folded = 2 * (p - width)  # the first ranks: pairs whose even rank sits out between fold and unfold
        # The busiest host at work in each phase: the fold's pairs, then (on the last host, where
        # the fewest sit out) all but the even folded ranks there.
        fold_model = self if link else Model(self.p, self.shape, active=min(k, folded))
        last_host_sitting_out = max(0, (folded + 1) // 2 - (p - k + 1) // 2)
        model = self if link or width == p else Model(self.p, self.shape, active=k - last_host_sitting_out)
        total = 0.0
        if width < p:  # the fold and the unfold: whole arrays between neighbours
            total += 2 * fold_model._send(n, k == 1, ws, link=link) + fold_model._combine(n, ws)
        distance, m = width // 2, n / 2
        while distance >= 1:
            across = distance >= k and self.shape.hosts > 1
            sharing = min(k, width) if across else 1
            total += 2 * model._send(m, across, ws, sharing, link, exchange=True) + model._combine(m, ws)
            distance, m = distance // 2, m / 2
        return total

    def _allreduce_tree(self, n):
        """Round r (from the leaves) has only the ranks with the r lowest bits clear at work: the
        crowding of the host is that of the ranks active in the round."""
        p, k = self.shape.ranks, self.shape.local
        rounds = math.ceil(math.log2(p)) if p > 1 else 0
        crossing = math.ceil(math.log2(self.shape.hosts)) if self.shape.hosts > 1 else 0
        ws = self._working_set(n, 1 + rounds)
        total = 0.0
        for index in range(rounds):
            pairs = math.ceil((k - 2 ** index) / 2 ** (index + 1))  # a rank without a partner waits
            at_work = Model(self.p, self.shape, active=min(k, 2 * max(1, pairs)))
            across = index >= rounds - crossing  # the largest spans of the tree join hosts
            total += 2 * at_work._send(n, across, ws) + at_work._combine(n, ws)
        return total

    def _allreduce_shm(self, n):
        """Each piece: a rank copies the slices the others reduce into its slot of the segment,
        reduces its own slice from every rank's slot, and copies every reduced slice out. The
        segment's pieces are small and stay in the cache, so every copy and reduction has one
        side in the cache and the array's side in its own regime."""
        return self._shm_reduce(n, copied_out=n)

    def _shm_reduce(self, n, copied_out):
        """The shared-memory allreduce of `n` bytes, of whose result each rank copies `copied_out`
        bytes out of the segment (the reduce-scatter: its own share). Every slice a rank reads from
        another's slot was just written there by that rank's core."""
        k = self.shape.local
        if k == 1:
            return 0.0
        pieces = max(1, math.ceil(n / self.p.shm_piece_bytes))
        ws = self._working_set(n, 1.0)
        others = (k - 1) / k * n
        copied = others + copied_out
        handed_over = others + (k - 1) / k * copied_out
        return (pieces * 2 * self._barrier() + copied * self._half_cached(self.p.copy, ws)
                + others * self._half_cached(self.p.combine, ws) + handed_over * self.p.shm_handover)

    def _half_cached(self, per_byte, working_set):
        return (per_byte.cache + per_byte.at(working_set, self.p.cache_bytes)) / 2 * self.crowding

    def _allreduce_hierarchical(self, n):
        """Shared memory inside each host, piece by piece; each piece's slices cross the hosts on
        `local` rings at once, which share the host's link."""
        k, h = self.shape.local, self.shape.hosts
        net = self.p.network or ASSUMED_NETWORK
        pieces = max(1, math.ceil(n / self.p.shm_piece_bytes))
        cross_bytes = n / k / h  # what one local rank's ring passes per step, over all pieces
        cross = 2 * (h - 1) * (pieces * net.alpha + cross_bytes * net.beta.memory * k)
        return self._allreduce_shm(n) + cross + (h - 1) * self._combine(cross_bytes, self._working_set(n, 1.0))

    def _allreduce_mpi(self, n):
        """MPICH and Open MPI reduce large arrays by recursive halving and doubling too, with the
        MPI library's own cost per message and per byte. Across hosts of several ranks each they
        go node by node: a reduce inside each host, the hosts' leaders among themselves, and a
        broadcast inside each host (modelled as binomial trees of whole arrays)."""
        if self.shape.hosts == 1 or self.shape.local == 1:
            return self._allreduce_halving_doubling(n, link=self.p.mpi)
        k, ws = self.shape.local, self._working_set(n)
        inside = math.ceil(math.log2(k)) * (2 * self._send(n, False, ws, link=self.p.mpi) + self._combine(n, ws))
        leaders = Model(self.p, JobShape(self.shape.hosts, self.shape.hosts))  # the others wait meanwhile
        return inside + leaders._allreduce_halving_doubling(n, link=self.p.mpi)

    # --- the other collectives (n: the bytes of the whole result)

    def _messages(self, count, nbytes, across, ws, link=None):
        """`count` exchanges one after another that carry `nbytes` between them."""
        return count * self._send(nbytes / count, across, ws, link=link, exchange=True)

    def _shm_pass(self, copied, n, handed_over):
        """The shared-memory allgather or broadcast of `n` bytes, as the busiest rank does it: one
        barrier per window (the segment's data area, a piece for each rank), its copies of `copied`
        bytes, of which `handed_over` read what another rank has just written."""
        windows = max(1, math.ceil(n / (self.shape.local * self.p.shm_piece_bytes)))
        return (windows * self._barrier() + self._copy(copied, self._working_set(n, 1.0))
                + handed_over * self.p.shm_handover)

    def reducescatter(self, family, n):
        p, across = self.shape.ranks, self.shape.hosts > 1
        ws, m = self._working_set(n), n / p
        if p == 1:
            cost = 0.0
        elif family == "shm":  # the allreduce, copying out only this rank's share
            cost = self._shm_reduce(n, copied_out=m)
        else:
            link = self.p.mpi if family == "mpi" else None
            count = math.ceil(math.log2(p)) if family == "mpi" else p - 1
            cost = self._messages(count, (p - 1) * m, across, ws, link) + (p - 1) * self._combine(m, ws)
        return self.p.calls.get(family, 0.0) + cost

    def allgather(self, family, n):
        p, across = self.shape.ranks, self.shape.hosts > 1
        ws = self._working_set(n, 1.0)
        if p == 1:
            cost = 0.0
        elif family == "shm":
            # Each rank copies its own part in and the others' out: the array once.
            cost = self._shm_pass(n, n, (self.shape.local - 1) / self.shape.local * n)
        elif family in ("halving_doubling", "mpi"):
            link = self.p.mpi if family == "mpi" else None
            width = 1 << (p.bit_length() - 1)
            cost = self._messages(int(math.log2(width)), (width - 1) / width * n, across, ws, link)
            if width < p:  # the fold's segment in, the whole result out
                cost += self._messages(2, n / p + n, False, ws, link)
        else:
            cost = self._messages(p - 1, (p - 1) / p * n, across, ws)
        return self.p.calls.get(family, 0.0) + cost

    def broadcast(self, family, n):
        p, across = self.shape.ranks, self.shape.hosts > 1
        ws = self._working_set(n, 1.0)
        rounds = math.ceil(math.log2(p)) if p > 1 else 0
        if p == 1:
            cost = 0.0
        elif family == "shm":
            # The root copies a window in while the others copy the last one out: the array once, in
            # the cache. Beyond it, the two share the memory bus and take turns.
            cost = self._shm_pass(n if ws <= self.p.cache_bytes else 2 * n, n, n)
        elif family == "mpi":  # a scatter and an allgather for large arrays
            cost = self._messages(rounds, 2 * (p - 1) / p * n, across, ws, self.p.mpi)
        else:  # down the binomial tree, in pieces that pipeline its levels
            piece = min(n, 4 << 20) or 1
            cost = (rounds + math.ceil(n / piece) - 1) * self._send(piece, across, ws)
        return self.p.calls.get(family, 0.0) + cost

    def cost(self, collective, family, n):
        return getattr(self, collective)(family, n)

    # --- the choice

    def candidates(self, collective, hierarchical=None):
        """The families that can run `collective` on this shape (`hierarchical`: the job's
        RINGREDUCE_HIERARCHICAL, None unless set)."""
        one_host = self.shape.hosts == 1
        if collective == "allreduce":
            if hierarchical and not one_host:
                return ["hierarchical", "mpi"]
            names = ["mpi", "ring", "halving_doubling", "tree"]
            if one_host:
                names.append("shm")
            elif hierarchical is None and self.shape.homogeneous and self.shape.local > 1:
                names.append("hierarchical")
            return names
        names = {"reducescatter": ["mpi", "ring"], "allgather": ["mpi", "ring", "halving_doubling"],
                 "broadcast": ["mpi", "ring"]}[collective]
        return names + ["shm"] if one_host and self.shape.local > 1 else names

    def choose(self, collective, n, hierarchical=None):
        return min(self.candidates(collective, hierarchical), key=lambda family: self.cost(collective, family, n))

    def table(self, collective, hierarchical=None):
        """[(from_bytes, family), ...]: the family for every size from each bound up to the next,
        as chosen at each power of two."""
        rows = []
        for size in TABLE_SIZES:
            family = self.choose(collective, size, hierarchical)
            if not rows or rows[-1][1] != family:
                rows.append((0 if not rows else size, family))
        return rows
