"""Rank 1 fails in the way named on the command line while the others call a collective.
Usage: misbehave.py MODE [MARKER]"""

import os
import signal
import sys
import time

import numpy as np

import ringreduce as rr

rr.init()
mode = sys.argv[1]
if rr.rank() == 1:
    if mode == "raise":
        raise ValueError("rank 1 fails on purpose")
    if mode == "exit3":
        sys.exit(3)
    if mode == "exit0":
        sys.exit(0)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "sigstop":  # frozen: alive, but no thread of it runs
        os.kill(os.getpid(), signal.SIGSTOP)
    if mode == "segfault":
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
if mode == "sleep":
    print("sleeping", flush=True)
    time.sleep(300)
rr.allreduce(np.ones(3), name="after")
print("finished", flush=True)
