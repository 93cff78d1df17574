"""Whose turn it is on this process's GPU, among the engines of its process sets.

NCCL's kernels wait on the GPU for their peers' kernels, and two communicators' kernels need not
both fit there, so collectives of two process sets started in opposite orders on two ranks can
deadlock: NCCL's documentation warns of it and torch.distributed leaves the ordering to the
user. Each set's engine cycles on a thread of its own, in no order the ranks agree on, so the
sets take this process's GPU in turn instead. A cycle with device requests pending (or of a
joined rank) takes the turn if it is free, never waiting for it, and keeps it to the cycle's end;
a cycle that finds it taken says so to the other ranks, and no device collective of that set is
agreed in that cycle (engine/negotiation.py). A set's device collective therefore runs in a
cycle where every member holds its turn: alone on each member's GPU.
"""

import threading

_turn = threading.Lock()


def take() -> bool:
    """The turn, if no other set's cycle holds it."""
    return _turn.acquire(blocking=False)


def give_back() -> None:
    _turn.release()
