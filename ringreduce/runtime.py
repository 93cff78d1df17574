"""This process's ringreduce state: init and shutdown, where the process sits (rank(), size()
and the rest), and its domains (the whole job and each process set), each with its engine.
"""

import sys
import time
import typing
import zlib
from collections.abc import Callable, Sequence

from mpi4py import MPI

from ringreduce.algorithms import choice
from ringreduce.config import Config
from ringreduce.engine import plain_calls
from ringreduce.engine.domain import Domain
from ringreduce.engine.flight_recorder import FlightRecorder
from ringreduce.engine.loop import Engine
from ringreduce.engine.negotiation import Stragglers
from ringreduce.engine.requests import Handle
from ringreduce.engine.timeline import NoTimeline, Timeline
from ringreduce.engine.wire import Wire
from ringreduce.errors import NotInitializedError, RankFailedError, RingReduceError, ranks_text
from ringreduce.launcher import protocol
from ringreduce.machine import faults, gpu, launch, topology
from ringreduce.planning import calibration, profiles
from ringreduce.resilience import exit_hooks, preemption, rrun_link

if typing.TYPE_CHECKING:  # process_sets imports this module
    from ringreduce.process_sets import ProcessSet

_active = None
_reporting = None  # the latest Runtime: what this rank reports over rrun's link


def _cost_profile(comm, config):
    """The cost model's profile, the same on every rank (ranks that chose differently would wait
    for each other forever): measured now when RINGREDUCE_CALIBRATE asks, else rank 0's saved one."""
    if config.calibrate:
        return calibration.measure(comm, piece_bytes=config.shared_memory_piece_bytes)[0]
    loaded = None
    if comm.rank == 0:
        try:
            loaded = profiles.load()
        except ValueError as error:  # every rank raises it, none waits for rank 0
            loaded = error
    loaded = comm.bcast(loaded, root=0)
    if isinstance(loaded, ValueError):
        raise loaded
    return loaded


class Runtime:
    def __init__(self, comm, config):
        self.config = config
        self.flight_recorder = FlightRecorder(config.flight_recorder)
        self.control = comm.Dup()  # process sets are made and removed here, on the callers' thread
        self._next_set_id = 1
        self._next_member_set_id = -1
        self.profile = _cost_profile(comm, config)
        ordered_comm = comm.Dup() if plain_calls.available(comm, config) else None
        self.topology, self.engine, self.gpu_transport = self._start_engine(
            comm.Dup(), select_gpu=True, caller_comm=ordered_comm and ordered_comm.Dup())
        ranks = range(self.topology.size)
        self.domains = {0: Domain(0, ranks, self.engine, comm.Dup(), self._ordered(ordered_comm, ranks, self.engine))}
        self.failing = False
        self.world = comm  # what the job shrinks from when a rank fails (ULFM)

    def _start_engine(self, engine_comm, ranks=None, where="", select_gpu=False, caller_comm=None):
        """An engine on `engine_comm` (which the engine owns from now on), with the algorithms
        chosen for its topology, and the same again on `caller_comm` (owned too) for the calls its
        callers run themselves; `ranks` name its ranks as the user knows them."""
        config = self.config
        place, selector, communicators = self._algorithms_on(engine_comm)
        host_comm, caller_selector = communicators[0], None
        if caller_comm is not None:
            caller_selector, more = self._algorithms_on(caller_comm)[1:]
            communicators += more
        # GPUs belong to the real machine: with simulated hosts, its ranks are more than one "host".
        machine_comm = (engine_comm.Split_type(MPI.COMM_TYPE_SHARED, key=engine_comm.rank)
                        if config.simulated_hosts else host_comm)
        try:
            if select_gpu:
                gpu.select_device(machine_comm)
            shared_bits = engine_comm.allreduce(gpu.local_capabilities(machine_comm), op=MPI.BAND)
        finally:
            if machine_comm is not host_comm:
                machine_comm.Free()
        transport = gpu.choose_transport(config.gpu_transport, shared_bits)
        device_family = choice.device_family(transport, selector, engine_comm, config)
        records = config.timeline and place.rank == 0 and ranks is None
        timeline = Timeline(config.timeline, 0) if records else NoTimeline()

        def release():
            for communicator in communicators:
                communicator.Free()

        stranded = self._tell_rrun_leaving if protocol.under_rrun() and ranks is None else None
        engine = Engine(Wire(engine_comm, config.cache_capacity), selector, config, timeline, device_family,
                        release, stranded, ranks, where, caller_selector)
        return place, engine, transport

    def _algorithms_on(self, comm):
        """(its topology, the algorithms chosen for it built on `comm`, the communicators to free
        after them: its host's, its hosts' leaders', and `comm`)."""
        place, host_comm, cross_comm = topology.discover(comm, self.config.simulated_hosts)
        selector = choice.select(self.config, place, comm, host_comm, cross_comm, self.profile)
        return place, selector, [host_comm, cross_comm, comm]

    def _tell_rrun_leaving(self, why):
        """This rank is leaving while others wait for it: no failure by itself, but to blame if
        the others then fail."""
        exit_hooks.tell_rrun(protocol.status_line(self.topology.rank, 0, left=why))

    def domain(self, process_set=None):
        """The domain of a ProcessSet (None: the whole job), where this rank must be a member."""
        set_id = 0 if process_set is None else process_set.process_set_id
        domain = self.domains.get(set_id)
        if domain is None:
            raise ValueError(f"{process_set!r} is not a process set of this job: add it with add_process_set() "
                             "or pass it to init(process_sets=...)")
        if domain.engine is None:
            raise ValueError(f"rank {self.topology.rank} is not in {domain.describe()}")
        return domain

    def domain_ranks(self, set_id):
        """The global ranks of a process set, whether or not this rank is a member."""
        if set_id not in self.domains:
            raise ValueError(f"process set {set_id} is not a process set of this job (removed?)")
        return self.domains[set_id].ranks

    def add_domain(self, ranks_or_comm, at_init=False):
        """Make a process set, collectively: every rank of the job calls this, in the same order.
        Returns its id. At init, a set of every rank is the global set (id 0), as in Horovod;
        later it is a duplicate."""
        ranks = self._ranks_of(ranks_or_comm)
        everyone = self.control.allgather(ranks)
        if any(theirs != ranks for theirs in everyone):
            by_value = {}
            for rank, theirs in enumerate(everyone):
                by_value.setdefault(tuple(theirs), []).append(rank)
            raise ValueError("add_process_set: the ranks do not agree across the job: " + " but ".join(
                f"{list(value)} on {ranks_text(who)}" for value, who in by_value.items()))
        if not ranks or ranks[0] < 0 or ranks[-1] >= self.topology.size or len(set(ranks)) != len(ranks):
            raise ValueError(f"a process set needs distinct ranks of this job (0 to {self.topology.size - 1}), "
                             f"got {ranks}")
        if at_init and ranks == self.domains[0].ranks:
            return 0
        if any(domain.ranks == ranks for set_id, domain in self.domains.items() if set_id >= 0):
            raise ValueError(f"a process set of ranks {ranks} exists already")
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise RingReduceError("process sets run their engines side by side, which needs MPI_THREAD_MULTIPLE")
        set_id, self._next_set_id = self._next_set_id, self._next_set_id + 1
        member = self.topology.rank in ranks
        set_comm = self.control.Split(color=0 if member else 1, key=self.topology.rank)
        if member:
            self.domains[set_id] = self._member_domain(set_comm, set_id, ranks)
        else:
            set_comm.Free()
            self.domains[set_id] = Domain(set_id, ranks, None, None)
        return set_id

    def add_domain_among(self, ranks, label):
        """Make a process set among its members alone: they call this together, in the same order,
        and the other ranks not at all (torch.distributed's subgroups, which only their members
        build). `label`, the same on every member, names it; its id is this rank's own (negative,
        apart from the job's sets)."""
        ranks = sorted(int(rank) for rank in ranks)
        if self.topology.rank not in ranks or len(set(ranks)) != len(ranks) or ranks[-1] >= self.topology.size:
            raise ValueError(f"a set its members make needs this rank ({self.topology.rank}) among distinct ranks "
                             f"of this job, got {ranks}")
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise RingReduceError("process sets run their engines side by side, which needs MPI_THREAD_MULTIPLE")
        group = self.control.Get_group().Incl(ranks)
        set_comm = self.control.Create_group(group, tag=zlib.crc32(label.encode()) % 32768)
        group.Free()
        set_id, self._next_member_set_id = self._next_member_set_id, self._next_member_set_id - 1
        self.domains[set_id] = self._member_domain(set_comm, set_id, ranks, label)
        return set_id

    def _member_domain(self, set_comm, set_id, ranks, label=None):
        """This member's end of a new set on `set_comm` (its engine owns the communicator)."""
        peer_comm = set_comm.Dup()
        ordered_comm = set_comm.Dup() if plain_calls.available(set_comm, self.config) else None
        where = f" in process set {label or set_id}"
        engine = self._start_engine(set_comm, ranks, where, caller_comm=ordered_comm and ordered_comm.Dup())[1]
        return Domain(set_id, ranks, engine, peer_comm, self._ordered(ordered_comm, ranks, engine, where), label)

    @staticmethod
    def _ordered(comm, ranks, engine, where=""):
        if comm is None:
            return None
        ordered = plain_calls.PlainCalls(comm, ranks, engine, where)
        engine.plain_call_stranded = ordered.stranded
        return ordered

    def remove_domain(self, set_id):
        """Remove a process set, collectively; False for the whole job's set or an unknown one (as
        Horovod). A set with requests in flight on any rank is a ValueError on every rank."""
        domain = self.domains.get(set_id)
        if set_id == 0 or domain is None:
            return False
        busy = self.control.allgather(domain.engine is not None and domain.engine.busy())
        if any(busy):
            raise ValueError(f"cannot remove {domain.describe()}: requests are in flight on "
                             f"{ranks_text([r for r, b in enumerate(busy) if b])}")
        _close(domain)
        del self.domains[set_id]
        return True

    def _ranks_of(self, ranks_or_comm):
        """The sorted global ranks of a list of ranks, or of an mpi4py communicator's members."""
        if isinstance(ranks_or_comm, MPI.Comm):
            members = ranks_or_comm.Get_group()
            return sorted(MPI.Group.Translate_ranks(members, list(range(members.size)), self.control.Get_group()))
        return sorted(int(r) for r in ranks_or_comm)

    def close(self):
        """Shut every domain's engine down at once, then wait for them: a rank that waits for this
        one in any of them (a plain call of the whole job, say, while this rank's sets would wait
        for that rank to shut them down too) hears that it is leaving."""
        closing = [(domain, _shut_down(domain)) for _, domain in sorted(self.domains.items(), reverse=True)
                   if domain.engine is not None]
        for domain, handle in closing:
            handle.wait()
            domain.engine.stopped()
            _free(domain)
        self.control.Free()
        if self.config.straggler_report and self.topology.rank == 0:
            stragglers = self.stragglers()
            print(stragglers.table(), file=sys.stderr, flush=True)

    def stragglers(self):
        """The whole job's straggler record: its engine's cycles and its plain calls in program order."""
        ordered = self.domains[0].ordered
        return Stragglers.combined([self.engine.negotiator.stragglers]
                                   + ([] if ordered is None else [ordered.stragglers]))

    def bytes_sent(self):
        """Bytes of the arrays the job's collectives carried so far, from this rank."""
        ordered = self.domains[0].ordered
        return self.engine.stats["bytes"] + (0 if ordered is None else ordered.bytes)

    def missing_ranks(self, set_id, name):
        """The ranks (as the user knows them) whose request `name` of process set `set_id` this
        rank has not heard of yet (by its engine, or its plain call in program order); None where
        it does not know (not negotiated yet, a set gone). Read from another thread: a table
        changing under us says nothing."""
        domain = self.domains.get(set_id)
        if domain is None or domain.engine is None:
            return None
        plain = domain.ordered.waiting if domain.ordered is not None else None
        if plain is not None and plain[0] == name:
            return plain[1]
        try:
            entry = domain.engine.negotiator.table.get(name)
            return None if entry is None else [rank for index, rank in enumerate(domain.ranks)
                                                if index not in entry.messages]
        except RuntimeError:
            return None

    def link_report(self):
        """What this rank tells rrun at each beat of its link: its flight records and its figures
        of the last minute (rrun's --monitor, and what it shows when the job fails or stalls)."""
        _, rows = self.stragglers().recent()
        rounds_per_second, wait_share, behind = rows[self.topology.rank]
        figures = {"now": time.time(), "rounds_per_second": rounds_per_second,
                   "wait_share": wait_share, "behind_seconds": behind, "bytes": self.bytes_sent()}
        return {"records": self.flight_recorder.snapshot(self.missing_ranks), **figures}


def _close(domain):
    """Stop a domain's engine and free its point-to-point communicator (where this rank is in it)."""
    if domain.engine is None:
        return
    _shut_down(domain).wait()
    domain.engine.stopped()
    _free(domain)


def _shut_down(domain):
    """Start stopping a domain's engine; the handle is done once every rank of it has stopped."""
    handle = Handle("shutdown")
    domain.engine.begin_shutdown(handle)
    return handle


def _free(domain):
    domain.peer_comm.Free()
    if domain.ordered is not None:
        domain.ordered.close()


def init(comm: typing.Any = None, process_sets: "Sequence[ProcessSet] | str | None" = None) -> None:
    """Start ringreduce on `comm` (default: MPI.COMM_WORLD), with these ProcessSets (Horovod's
    argument; "dynamic" is accepted, and needed for nothing: sets can be added at any time, see
    docs/horovod.md).
    Calling it again does nothing."""
    global _active, _reporting
    if _active is not None:
        return
    comm = MPI.COMM_WORLD if comm is None else comm
    launch.check_launch(comm)
    launch.check_thread_level()
    _active = _reporting = Runtime(comm, Config.from_env())
    exit_hooks.install(active_or_none, shutdown)
    preemption.install()
    rrun_link.connect(_active.topology.rank, _link_report)
    given: Sequence[ProcessSet] = () if process_sets is None or isinstance(process_sets, str) else process_sets
    for process_set in given:
        process_set.process_set_id = _active.add_domain(process_set.mpi_comm or process_set.ranks, at_init=True)


def _link_report():
    """This rank's report to rrun: the latest runtime's (after its shutdown too: a rank that
    left still tells what it did last)."""
    return _reporting.link_report()


def shutdown() -> None:
    """Leave the job cleanly: waits until every other rank has shut down too. Requests still
    pending on this rank fail; on the other ranks, requests that needed this one fail too."""
    global _active
    if _active is None:
        return
    runtime, _active = _active, None
    runtime.close()


def end_job_at_exit(error: str) -> None:
    """This rank's collectives cannot go on (a call of it timed out, say): its exit, however it
    comes, ends the job as an uncaught error would, naming `error`, instead of waiting for the
    other ranks to shut down too."""
    if _active is not None and _active.topology.size > 1:
        exit_hooks.end_job_at_exit(_active, 1, error)


def shrink() -> None:
    """Go on without the ranks that failed (MPI's fault tolerance, ULFM): the runtime of the old job
    is left as it is (its communicators include the dead; freeing them would wait for it), its
    engines stop, and ringreduce starts again on the survivors (MPIX_Comm_shrink of the job's
    communicator). Every survivor calls it; process sets are gone."""
    global _active
    broken = active()
    _active = None
    cause = RankFailedError("the job shrank after a rank failed")
    for domain in broken.domains.values():
        if domain.engine is not None:
            domain.engine.abandon(cause)
    faults.clear()
    init(comm=broken.world.Shrink())


def peer_failed(error: BaseException | None) -> bool:
    """Is `error` (or its cause) what a rank's failure makes the survivors raise?"""
    if faults.failed():
        return True
    while error is not None:
        if isinstance(error, RankFailedError) or (
                isinstance(error, MPI.Exception) and error.Get_error_class() in faults.FAILURE_CLASSES):
            return True
        error = error.__cause__
    return False



def is_initialized() -> bool:
    return _active is not None


def is_homogeneous() -> bool:
    """Does every host run the same number of ranks?"""
    return active().topology.homogeneous


def mpi_threads_supported() -> bool:
    """Did MPI start with MPI_THREAD_MULTIPLE, so that the program may call MPI itself (through
    mpi4py) beside ringreduce?"""
    active()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a timeline (a Chrome trace, written by rank 0) into `file_path`, in place of
    any recorded so far; `mark_cycles` adds a mark for each engine cycle that ran something."""
    runtime = active()
    if runtime.topology.rank == 0:
        runtime.engine.record_to(Timeline(file_path, 0, mark_cycles))


def stop_timeline() -> None:
    """Stop recording the timeline and close its file."""
    runtime = active()
    if runtime.topology.rank == 0:
        runtime.engine.record_to(NoTimeline())


def _where(field: str, doc: str) -> Callable[[], int]:
    """A query of this process's place in the job, answered once ringreduce is initialized."""
    def query() -> int:
        return getattr(active().topology, field)
    query.__name__ = query.__qualname__ = field
    query.__doc__ = doc
    return query


rank = _where("rank", "This process's rank in the job, 0 to size() - 1.")
size = _where("size", "The number of ranks in the job.")
local_rank = _where("local_rank", "This process's rank among the ranks on its host.")
local_size = _where("local_size", "The number of ranks on this process's host.")
cross_rank = _where("cross_rank", "This process's host, among the hosts (the rank of its local rank's group).")
cross_size = _where("cross_size", "The number of ranks with this process's local rank: the hosts that have one.")


def active_or_none():
    return _active


def active():
    if _active is None:
        raise NotInitializedError("ringreduce has not been initialized; call ringreduce.init() first")
    return _active


def engine_stats() -> dict[str, int]:
    """Counters of the engine's work so far (of the whole job's set): cycles, collectives, tensors
    and bytes, cache hits, and the cycles whose negotiation needed every rank's full state
    (state_gathers); and the plain calls that ran in program order, without the engine."""
    runtime = active()
    engine, ordered = runtime.engine, runtime.domains[0].ordered
    return {**engine.stats, "cache_hits": engine.negotiator.cache_hits, "state_gathers": engine.wire.gathers,
            "in_program_order": 0 if ordered is None else ordered.ran}


def straggler_report() -> dict[str, typing.Any]:
    """Per rank that was ever the last one ready: in what share of the rounds (the engine's cycles
    that ran something, and the plain calls in program order) it was last, and how long it kept
    the others waiting then, on average; and, over the last minute (`window_seconds`), every
    rank's rounds per second, share of the time spent waiting for the others, and how far behind
    the first rank it came on average: a rank always slow stands apart from one that stalled once.
    Any rank can ask at any time; all of them see the same figures."""
    stragglers = active().stragglers()
    span, rows = stragglers.recent()
    return {"cycles": stragglers.cycles,
            "ranks": [{"rank": r, "share_last": share, "mean_late_seconds": late}
                      for r, share, late in stragglers.report()],
            "window_seconds": span,
            "recent": [{"rank": r, "rounds_per_second": rate, "wait_share": wait, "mean_behind_seconds": behind}
                       for r, (rate, wait, behind) in enumerate(rows)]}


