"""How many CPUs a process may use: one count for every part of ringreduce that sizes work by
cores (the cost model, the threads per rank). Standard library only, so rrun's per-rank wrapper
imports it before MPI."""

import os


def usable_cores():
    """The CPUs this process may run on (its affinity): how ringreduce counts a host's cores, for
    the cost model's profile and for the threads each rank starts."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1
