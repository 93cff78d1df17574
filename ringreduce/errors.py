"""The exceptions a ringreduce user can catch, and how their messages name ranks.

Every error that depends on what several ranks did is raised on every rank with the same
message, so a job never hangs with one rank waiting for a partner that has given up. Bad
arguments raise what Python users expect (TypeError, ValueError), as Horovod's calls do.
"""


class RingReduceError(RuntimeError):
    """Base class of ringreduce's own errors."""


# Horovod's name for a collective that failed (a RuntimeError, as ours): `except
# hvd.HorovodInternalError` catches every ringreduce error, MismatchError and PeerExitedError too.
HorovodInternalError = RingReduceError


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal to an elastic job that its hosts changed: State.commit() raises it on every
    rank once the commit is kept, and ringreduce.elastic.run ends the generation for rrun to start
    the next on the new hosts. `skip_sync` is Horovod's argument (whether the state need not be
    synchronised after the resize); ringreduce resumes from the commit either way."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts changed")
        self.skip_sync = skip_sync


class NotInitializedError(RingReduceError, ValueError):
    """A collective was called before ringreduce.init() (or after shutdown()). Also a ValueError,
    as Horovod's is."""


class MismatchError(RingReduceError, ValueError):
    """The ranks called a collective with arguments that do not agree."""


class PeerExitedError(RingReduceError):
    """Another rank left the job while this rank waited for it in a collective."""


class UnsupportedDtypeError(RingReduceError, TypeError):
    """The array's dtype (or the dtype/op pair) cannot be communicated."""


class StallError(RingReduceError):
    """Ranks waited past RINGREDUCE_STALL_SHUTDOWN_TIME for requests that others never submitted."""


class DeadlockError(RingReduceError):
    """Every rank was blocked waiting, with nothing new submitted anywhere, for requests that other
    ranks have not submitted (RINGREDUCE_DEADLOCK_TIME); raised on every rank, which can go on."""


class GpuError(RingReduceError):
    """A GPU array reached ringreduce where no GPU can be used, or no agreed transport exists."""


class RankFailedError(RingReduceError):
    """A rank of the job failed and the survivors go on without it (an elastic job under an MPI with
    ULFM): what every survivor's waits raise, until ringreduce.elastic.run shrinks the job."""


class CorruptCheckpointError(RingReduceError):
    """A checkpoint file is not whole (truncated, or its contents do not match their checksum)."""


class UnsafeFileError(RingReduceError):
    """A checkpoint or commit, or its directory, that another user owns or can write: reading it
    would run their code."""


def ranks_text(ranks):
    """'rank 3' or 'ranks 0, 2': how every message names the ranks involved."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
