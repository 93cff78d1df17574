"""Where an elastic job keeps its commits: in memory, and in node-local storage on every host
(/dev/shm, or the directory rrun's --commit-dir gives), written by each host's first rank, so that
losing any one host loses no committed state and a restarted generation reads its commit locally.

A commit is named by (generation, sequence): the generation that made it and its number along the
training. Commits with the same name hold the same state on every host (the state is the same on
every rank). A commit is confirmed when every host has written it; only then are the older ones
deleted, so until then the previous one is still there everywhere. A generation resumes from the
newest whole commit any rank holds: it is the newest state of the training that anyone kept
(a commit some host missed is sent to it over MPI). Outside an elastic job under rrun, commits stay
in memory only, unless RINGREDUCE_COMMIT_DIR names a directory.

The directory must be private to this user (made 0700, refused otherwise: checkpoint.private_directory),
and each commit carries an HMAC under the job's secret from rrun, checked before it is unpickled:
a commit the job did not write is skipped and reported, never loaded."""

import os
import pickle
import re
import sys

from ringreduce import checkpoint, runtime
from ringreduce.errors import CorruptCheckpointError, RingReduceError, UnsafeFileError
from ringreduce.launcher import protocol
from ringreduce.objects import allgather_object, broadcast_object

_NAME = re.compile(r"^commit-(\d+)-(\d+)\.rr$")


def generation(environ=os.environ):
    """This job's generation: 0 at first, one more after each resize or failure."""
    return int(environ.get(protocol.GENERATION_VARIABLE, "0"))


def default_directory(environ=os.environ):
    """The directory rrun gave, else one for this elastic job in /dev/shm (memory, local to the
    host); None outside an elastic job (commits stay in memory: nothing would resume from them, and
    a later job must not)."""
    if protocol.COMMIT_DIR_VARIABLE in environ:
        return environ[protocol.COMMIT_DIR_VARIABLE]
    job = environ.get(protocol.JOB_VARIABLE)
    return None if job is None else protocol.DEFAULT_COMMIT_DIR.format(job=job)


class CommitStore:
    def __init__(self, directory=None, environ=os.environ):
        self.directory = directory or default_directory(environ)
        self.given = directory is not None or protocol.COMMIT_DIR_VARIABLE in environ
        secret = environ.get(protocol.SECRET_VARIABLE)
        self._key = bytes.fromhex(secret) if secret else None

    def _writer(self):
        return self.directory is not None and runtime.active().topology.local_rank == 0

    def keys(self):
        """The whole commits on this host, newest first (UnsafeFileError where the directory is
        not private to this user)."""
        if self.directory is None or not os.path.lexists(self.directory):
            return []
        checkpoint.private_directory(self.directory)
        return sorted(((int(m[1]), int(m[2])) for name in os.listdir(self.directory) if (m := _NAME.match(name))),
                      reverse=True)

    def path(self, key):
        return os.path.join(self.directory, f"commit-{key[0]:06d}-{key[1]:09d}.rr")

    def write(self, key, payload):
        """On this host's first rank: keep the pickled state `payload` as commit `key`; what went
        wrong, or None. Others return None at once."""
        if not self._writer():
            return None
        try:
            checkpoint.private_directory(self.directory)
            checkpoint.write_pickled(payload, self.path(key), self._key)
        except UnsafeFileError as error:
            return str(error)
        except OSError as error:
            return f"{self.path(key)}: {error.strerror or error}"
        return None

    def confirm(self, key, problem, flag=False):
        """Collective, after every rank's write(): raise on every rank if any host could not keep
        the commit (the older ones stay); else delete the older ones. Returns whether any rank's
        `flag` was set (it carries the check for new hosts in the same exchange)."""
        reports = allgather_object((problem, runtime.active().topology.rank, bool(flag)), name="elastic.commit")
        failed = [(rank, text) for text, rank, _ in reports if text is not None]
        if failed:
            raise RingReduceError(f"commit {key[1]} could not be kept on every host (rank {failed[0][0]}: "
                                  f"{failed[0][1]}); the previous commit is kept")
        if self._writer():
            for old in self.keys():
                if old < key:
                    os.unlink(self.path(old))
        return any(flagged for _, _, flagged in reports)

    def newest(self):
        """Collective: (key, payload) of the newest whole commit any rank holds, on every rank (read
        locally where every host has it, else sent from a holder, and written by the hosts that
        lacked it); (None, None) where there is none."""
        mine, state = self._readable_newest()
        held = allgather_object(mine, name="elastic.commits")
        keys = [key for key in held if key is not None]
        if not keys:
            return None, None
        best = max(keys)
        if all(key == best for key in held):
            return best, state
        state = broadcast_object(state if mine == best else None, root_rank=held.index(best),
                                 name="elastic.commit.send")
        if mine != best:
            self.write(best, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
        return best, state

    def _readable_newest(self):
        """(key, state) of this host's newest commit that reads whole (a broken one is skipped with a
        warning), or (None, None)."""
        for key in self.keys():
            try:
                return key, checkpoint.read(self.path(key), self._key)
            except CorruptCheckpointError as problem:
                print(f"ringreduce: skipping commit {self.path(key)}: {problem}", file=sys.stderr, flush=True)
        return None, None

    def discard(self):
        """Remove this job's commits from this host (its own directory only, not one the user gave)."""
        if self._writer() and not self.given and os.path.isdir(self.directory):
            for key in self.keys():
                os.unlink(self.path(key))
            os.rmdir(self.directory)

