"""Checkpoint files: written by rank 0 atomically, the newest kept, damaged ones skipped on load.
Usage: checkpoints.py DIR; prints REPORT lines."""

import json
import os
import sys

import ringreduce as rr
from ringreduce import checkpoint

rr.init()
directory = sys.argv[1]
for step in (10, 20, 30, 40):
    checkpoint.save({"step": step, "rank": rr.rank(), "payload": list(range(step))}, directory, step, keep=3)
rr.barrier()
report = {"files": sorted(os.listdir(directory))}
report["latest"] = checkpoint.load_latest(directory)
if rr.rank() == 0:  # damage the newest two: cut one short, flip a byte of the other
    newest = checkpoint.path_for(directory, 40)
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) - 5)
    middle = checkpoint.path_for(directory, 30)
    data = bytearray(open(middle, "rb").read())
    data[-3] ^= 0xFF
    open(middle, "wb").write(bytes(data))
rr.barrier()
report["after_damage"] = checkpoint.load_latest(directory)
report["empty"] = checkpoint.load_latest(os.path.join(directory, "nothing-here"))
print("REPORT " + json.dumps(report), flush=True)
