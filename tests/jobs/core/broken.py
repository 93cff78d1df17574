"""The engine breaks inside a cycle, on every rank (a fault injected into the executor), in a
cycle run on the caller's thread or on the engine thread; the script catches the error, tries
another call, and shuts down. Usage: broken.py caller|engine"""

import sys
import time

import numpy as np

import ringreduce as rr
from ringreduce import runtime

rr.init()


def injected_fault(responses, requests):
    raise RuntimeError("injected fault")


runtime.active().engine.executor.run = injected_fault
try:
    if sys.argv[1] == "caller":
        rr.grouped_allreduce([np.ones(3)], name="doomed")  # a plain call the engine runs: on the caller's thread
    else:
        handle = rr.allreduce_async(np.ones(3), name="doomed")
        while not rr.poll(handle):  # never waits in synchronize: only the engine thread runs cycles
            time.sleep(0.01)
        rr.synchronize(handle)
except rr.RingReduceError as error:
    print(f"caught: {error}", flush=True)
    print(f"chained: {error.__cause__!r}", flush=True)
try:
    rr.allreduce(np.ones(3), name="later")
except rr.RingReduceError as error:
    print(f"later: {error}", flush=True)
rr.shutdown()
print("shut down", flush=True)
