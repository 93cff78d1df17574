"""Collectives on picklable Python objects, for small things such as configs and metrics."""

import itertools
import pickle
import typing

import numpy as np

from ringreduce import collectives, runtime
from ringreduce.machine.layout import offsets_of
from ringreduce.process_sets import ProcessSet, global_process_set


def broadcast_object(obj: typing.Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> typing.Any:
    """Every rank (of the set) gets the root rank's object; root_rank is a global rank."""
    is_root = runtime.active().topology.rank == root_rank
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if is_root else np.empty(0, dtype=np.uint8)
    length = collectives.broadcast(np.array([len(payload)], dtype=np.int64), root_rank, name=name,
                                   process_set=process_set)
    if not is_root:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    return pickle.loads(collectives.broadcast(payload, root_rank, name=name, process_set=process_set).tobytes())


def allgather_object(obj: typing.Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[typing.Any]:
    """A list of every rank's object (of the set), in rank order."""
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    lengths = collectives.allgather(np.array([len(payload)], dtype=np.int64), name=name, process_set=process_set)
    gathered = collectives.allgather(payload, name=name, process_set=process_set).tobytes()
    offsets = offsets_of(lengths)
    return [pickle.loads(gathered[start:end]) for start, end in itertools.pairwise(offsets)]
