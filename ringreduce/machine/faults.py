"""A rank of the job has failed, and the survivors are to go on without it (MPI's fault tolerance,
ULFM): rrun says so over its link to every rank, and every wait of ringreduce's (for MPI requests
and in shared memory) checks here, so that no survivor stays blocked on the dead rank."""

from mpi4py import MPI

from ringreduce.errors import RankFailedError

_failure = None  # what rrun said failed, until the job has shrunk
# The error classes of an MPI call that met a failed rank (ULFM); none where the MPI has no ULFM.
FAILURE_CLASSES = tuple(getattr(MPI, name) for name in ("ERR_PROC_FAILED", "ERR_REVOKED") if hasattr(MPI, name))


def report(message):
    global _failure
    _failure = message


def check():
    """Raise RankFailedError on a rank whose job has lost a rank."""
    if _failure is not None:
        raise RankFailedError(_failure)


def failed():
    return _failure is not None


def clear():
    global _failure
    _failure = None
