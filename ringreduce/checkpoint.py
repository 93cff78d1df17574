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
"""

import hashlib
import os
import pickle
import re
import struct
import sys
import tempfile
import typing

from ringreduce import runtime
from ringreduce.errors import CorruptCheckpointError
from ringreduce.objects import allgather_object, broadcast_object

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


def write_pickled(payload, target):
    """A state already pickled into `target`, whole or not at all, durably."""
    directory = os.path.dirname(target)
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=".checkpoint-", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as f:
            f.write(MAGIC + _HEADER.pack(len(payload), hashlib.sha256(payload).digest()))
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
    broadcast to every rank; (None, None) when there is none. Call it on every rank."""
    found = (None, None)
    if runtime.active().topology.rank == root_rank:
        for step, path in _checkpoints(directory):
            try:
                found = (step, read(path))
                break
            except CorruptCheckpointError as problem:
                print(f"ringreduce: skipping checkpoint {path}: {problem}", file=sys.stderr, flush=True)
    return broadcast_object(found, root_rank=root_rank, name=f"checkpoint.load.{directory}")


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


def read(path):
    """The state in one checkpoint file; CorruptCheckpointError if it is not whole."""
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
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpointError("its contents do not match their checksum")
    return pickle.loads(payload)


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
