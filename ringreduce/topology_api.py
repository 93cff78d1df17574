"""rank(), size() and the rest: where this process sits, once ringreduce is initialized."""

from ringreduce import runtime


def rank():
    return runtime.active().topology.rank


def size():
    return runtime.active().topology.size


def local_rank():
    return runtime.active().topology.local_rank


def local_size():
    return runtime.active().topology.local_size


def cross_rank():
    return runtime.active().topology.cross_rank


def cross_size():
    return runtime.active().topology.cross_size
