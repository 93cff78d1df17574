"""Checkpoints that survive a failing job: written by rank 0 only, atomically, checked on load.

State that differs per rank (a compressor's error-feedback residuals) is kept beside it: every
rank writes its own file, named with its rank and the job's size, and a job of the same size reads
its own back; a job of another size finds none and starts that state afresh.

`save` writes the state (any picklable object) to a temporary file in the checkpoint directory,
fsyncs it, renames it into place and fsyncs the directory, so a checkpoint file either holds a
whole checkpoint or does not exist; it keeps the newest `keep` files. Each file starts with a
header (a magic line, the payload's length and its SHA-256), so a truncated or corrupted file is
recognised on load, skipped with a warning, and the next older one is used. `load_latest` reads
on rank 0 and broadcasts, so every rank resumes from the same state.

Unpickling runs code, so what is read must be this user's own: `load_latest` refuses a directory
or file that another user owns or can write, and an elastic job's commits carry an HMAC under the
job's secret instead of a bare SHA-256 (`key`), checked before anything is unpickled.
"""

import hashlib
import hmac
import os
import pickle
import re
import stat
import struct
import sys
import tempfile
import typing

from ringreduce import runtime
from ringreduce.errors import CorruptCheckpointError, UnsafeFileError
from ringreduce.objects import allgather_object, broadcast_object
from ringreduce.resilience.safe_files import private_directory  # noqa: F401 (part of this module's API)

MAGIC = b"ringreduce checkpoint 1\n"
_HEADER = struct.Struct("<Q32s")  # payload length, SHA-256 of the payload
_NAME = re.compile(r"^checkpoint-(\d+)\.rr$")


def path_for(directory, step):
    return os.path.join(directory, f"checkpoint-{step:09d}.rr")


def rank_path_for(directory, step, rank, size):
    return os.path.join(directory, f"checkpoint-{step:09d}.rank{rank}-of-{size}.rr")


def save(state: typing.Any, directory: str | os.PathLike, step: int, keep: int = 3,
         rank_state: typing.Any = None) -> str | None:
    """On rank 0: write `state` as the checkpoint of `step` and keep the newest `keep`. Other
    ranks return at once (call it on every rank, as the state of every rank is the same), unless
    `rank_state` is given: then every rank writes its own, beside it, and keeps its newest `keep`."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    topology = runtime.active().topology
    if rank_state is None and topology.rank != 0:
        return None
    os.makedirs(directory, exist_ok=True)
    if rank_state is not None:
        write(rank_state, rank_path_for(directory, step, topology.rank, topology.size))
        mine = re.compile(rf"^checkpoint-(\d+)\.rank{topology.rank}-of-\d+\.rr$")
        for _, old in _checkpoints(directory, mine)[keep:]:
            os.unlink(old)
    if topology.rank != 0:
        return None
    target = path_for(directory, step)
    write(state, target)
    for _, old in _checkpoints(directory)[keep:]:
        os.unlink(old)
    return target


def write(state, target):
    """`state` into `target`, whole or not at all, durably."""
    write_pickled(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), target)


def write_pickled(payload, target, key: bytes | None = None):
    """A state already pickled into `target` (a file only this user can read), whole or not at
    all, durably; with `key`, its digest is the payload's HMAC under it."""
    directory = os.path.dirname(target)
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=".checkpoint-", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as f:
            f.write(MAGIC + _HEADER.pack(len(payload), _digest(payload, key)))
            f.write(payload)  # apart: joining them would copy the whole payload once more
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)


def load_latest(directory: str | os.PathLike, root_rank: int = 0) -> tuple[int | None, typing.Any]:
    """(step, state) of the newest intact checkpoint in `directory`, read on `root_rank` and
    broadcast to every rank; (None, None) when there is none. Call it on every rank. A directory
    or checkpoint that another user owns or can write is refused on every rank (UnsafeFileError):
    loading it would run their code."""
    found, refused = (None, None), None
    if runtime.active().topology.rank == root_rank:
        try:
            if os.path.isdir(directory):
                only_mine(directory)
            for step, path in _checkpoints(directory):
                try:
                    only_mine(path)
                    found = (step, read(path))
                    break
                except CorruptCheckpointError as problem:
                    print(f"ringreduce: skipping checkpoint {path}: {problem}", file=sys.stderr, flush=True)
        except UnsafeFileError as error:
            refused = str(error)
    found, refused = broadcast_object((found, refused), root_rank=root_rank, name=f"checkpoint.load.{directory}")
    if refused is not None:
        raise UnsafeFileError(f"rank {root_rank}: {refused}")
    return found


def only_mine(path: str | os.PathLike) -> None:
    """Raise UnsafeFileError unless `path` (not followed if a link) is this user's and no one else
    can write it."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeFileError(f"{path} is a symbolic link; give the real path")
    if info.st_uid != os.getuid():
        raise UnsafeFileError(f"{path} belongs to user {info.st_uid}, not to this user ({os.getuid()}): "
                              "its checkpoints could run that user's code here")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeFileError(f"{path} can be written by other users (mode {stat.S_IMODE(info.st_mode):o}), "
                              f"who could plant a checkpoint that runs their code here: chmod go-w {path}")


def load_rank_state(directory: str | os.PathLike, step: int) -> typing.Any:
    """This rank's own state saved with checkpoint `step`, where every rank of the job has its
    own intact (same size as when saved); else None on every rank, and rank 0 says why. Call it on
    every rank."""
    topology = runtime.active().topology
    path, mine, problem = rank_path_for(directory, step, topology.rank, topology.size), None, None
    try:
        mine = read(path)
    except FileNotFoundError:
        problem = f"no state of rank {topology.rank} of {topology.size} ranks"
    except CorruptCheckpointError as corrupt:
        problem = f"{os.path.basename(path)}: {corrupt}"
    problems = [p for p in allgather_object(problem, name=f"checkpoint.rank_state.{directory}") if p is not None]
    if problems:
        if topology.rank == 0:
            print(f"ringreduce: checkpoint {step} in {directory}: {problems[0]}"
                  f"{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}; the per-rank state "
                  "(compression residuals) starts afresh", file=sys.stderr, flush=True)
        return None
    return mine


def read(path, key: bytes | None = None):
    """The state in one checkpoint file; CorruptCheckpointError if it is not whole (or, with
    `key`, not written with it), found before anything is unpickled."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(MAGIC):
        raise CorruptCheckpointError("not a ringreduce checkpoint (bad header)")
    header_end = len(MAGIC) + _HEADER.size
    if len(data) < header_end:
        raise CorruptCheckpointError("truncated inside its header")
    length, digest = _HEADER.unpack(data[len(MAGIC):header_end])
    payload = data[header_end:]
    if len(payload) != length:
        raise CorruptCheckpointError(f"truncated: {len(payload)} of {length} bytes")
    if not hmac.compare_digest(_digest(payload, key), digest):
        raise CorruptCheckpointError("not signed with this job's secret" if key is not None
                                     else "its contents do not match their checksum")
    return pickle.loads(payload)


def _digest(payload, key):
    return hashlib.sha256(payload).digest() if key is None else hmac.new(key, payload, hashlib.sha256).digest()


def _checkpoints(directory, pattern=_NAME):
    """[(step, path)] of the checkpoint files in `directory` (those `pattern` matches), newest first."""
    if not os.path.isdir(directory):
        return []
    found = [(int(m[1]), os.path.join(directory, name)) for name in os.listdir(directory)
             if (m := pattern.match(name))]
    return sorted(found, reverse=True)


def _fsync_directory(directory):
    """Make the rename itself durable."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
