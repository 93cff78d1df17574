"""Process sets: collectives among some of the job's ranks, as in Horovod.

Each set is its own negotiation domain (its own communicator, engine thread and cache), so
collectives on disjoint or overlapping sets run side by side and in any order across sets. Every
rank of the job makes and removes sets together, in the same order; a rank passes a set only to
collectives of sets it is a member of. Ranks are global ranks everywhere (root_rank too); rank()
gives the rank within the set, to read an allgather's result.
"""

import typing
from collections.abc import Iterable, Sequence

from ringreduce import runtime
from ringreduce.engine.call_sites import user_call_site
from ringreduce.errors import ranks_text


class ProcessSet:
    """Some of the job's ranks, given as a list of global ranks or as an mpi4py communicator.
    Pass it to init(process_sets=[...]) or add_process_set() to make it usable; until then
    process_set_id is None."""

    def __init__(self, ranks_or_comm: Iterable[int] | typing.Any) -> None:
        self.process_set_id: int | None = None
        self._given_ranks: list[int] | None = None
        self.mpi_comm = None
        if hasattr(ranks_or_comm, "Get_group"):  # an mpi4py communicator; MPI itself stays in the runtime
            self.mpi_comm = ranks_or_comm
        else:
            try:
                self._given_ranks = sorted(int(rank) for rank in ranks_or_comm)
            except TypeError:
                raise ValueError("a ProcessSet is made from a list of ranks or an mpi4py communicator, "
                                 f"got {ranks_or_comm!r}") from None

    @property
    def ranks(self) -> list[int] | None:
        """The set's global ranks, sorted; None for a communicator's set before it is made."""
        if self.process_set_id is not None and runtime.is_initialized():
            return runtime.active().domain_ranks(self.process_set_id)
        return self._given_ranks

    def size(self) -> int | None:
        """How many ranks the set has; None before it is made."""
        ranks = self.ranks
        return None if self.process_set_id is None or ranks is None else len(ranks)

    def rank(self) -> int | None:
        """This rank's place within the set (what allgather orders by); None before it is made."""
        ranks = self.ranks
        if self.process_set_id is None or ranks is None:
            return None
        me = runtime.active().topology.rank
        if me not in ranks:
            raise ValueError(f"rank {me} is not in {self}")
        return ranks.index(me)

    def included(self) -> bool | None:
        """Is this rank a member? None before the set's ranks are known."""
        if self.ranks is None:
            return None
        return runtime.active().topology.rank in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"


def by_id(process_set_id: int) -> ProcessSet:
    """The made set with this id, for calls that name a set by its id (TensorFlow's size_op)."""
    process_set = ProcessSet(runtime.active().domain_ranks(process_set_id))
    process_set.process_set_id = process_set_id
    return process_set


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Make a set (a ProcessSet or a list of ranks) after init, on every rank of the job together,
    and return it. Ranks that disagree, a rank outside the job or a set that exists already are a
    ValueError on every rank. Unlike Horovod, no environment variable is needed, and a set made
    from a communicator may be added too."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} has been added already")
    _together("add_process_set")
    process_set.process_set_id = runtime.active().add_domain(process_set.mpi_comm or process_set.ranks)
    return process_set


def process_set_among(ranks: Sequence[int], label: str) -> ProcessSet:
    """A set made by its members alone, together and in the same order (no other rank takes
    part), named by `label` (the same on every member): for a framework whose groups only their
    members build, as torch.distributed's subgroups."""
    process_set = ProcessSet(ranks)
    process_set.process_set_id = runtime.active().add_domain_among(process_set.ranks, label)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a set, on every rank of the job together. False (as in Horovod) for the global set
    or one that was never made; a set with collectives in flight is a ValueError."""
    if process_set.process_set_id is None:
        return False
    _together("remove_process_set")
    removed = runtime.active().remove_domain(process_set.process_set_id)
    if removed:
        process_set.process_set_id = None
    return removed


def _together(call):
    """Meet the other ranks in `call` through the whole job's engine first, so that a rank that
    is in another collective (one that raised alone and skipped a call, say) is a clear error on
    every rank, naming each rank's call and where it was made, instead of a hang in the MPI
    collectives that make and remove the set."""
    from ringreduce import objects  # objects depends on this module

    calls = objects.allgather_object((call, user_call_site()), name="ringreduce.process_sets")
    if len({name for name, _ in calls}) > 1:
        by_call = {}
        for rank, (name, site) in enumerate(calls):
            by_call.setdefault(f"{name} (at {site or 'an unknown place'})", []).append(rank)
        raise ValueError("the ranks are not making the same process set change: "
                         + " but ".join(f"{text} on {ranks_text(who)}" for text, who in by_call.items()))
