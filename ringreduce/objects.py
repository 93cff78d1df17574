"""Collectives on picklable Python objects, for small things such as configs and metrics."""

import itertools
import pickle

import numpy as np

from ringreduce import collectives, runtime
from ringreduce.machine.layout import offsets_of
from ringreduce.process_sets import global_process_set


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Every rank (of the set) gets the root rank's object; root_rank is a global rank."""
    is_root = runtime.active().topology.rank == root_rank
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if is_root else None
    length = np.array([0 if payload is None else len(payload)], dtype=np.int64)
    length = collectives.broadcast(length, root_rank, name=name, process_set=process_set)
    if not is_root:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    return pickle.loads(collectives.broadcast(payload, root_rank, name=name, process_set=process_set).tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """A list of every rank's object (of the set), in rank order."""
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    lengths = collectives.allgather(np.array([len(payload)], dtype=np.int64), name=name, process_set=process_set)
    gathered = collectives.allgather(payload, name=name, process_set=process_set).tobytes()
    offsets = offsets_of(lengths)
    return [pickle.loads(gathered[start:end]) for start, end in itertools.pairwise(offsets)]
