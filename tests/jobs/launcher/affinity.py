"""Prints the CPUs this rank may run on, as JSON."""

import json
import os

print(json.dumps(sorted(os.sched_getaffinity(0))), flush=True)
