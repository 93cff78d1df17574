"""How many CPUs a process may use: one count for every part of ringreduce that sizes its work by
the host's cores (the cost model's profile and calibration)."""

import os


def usable_cores():
    """The CPUs this process may run on (its affinity): how ringreduce counts a host's cores."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1
