"""A rank leaves (its program ends) while the others wait for it in a plain barrier of the whole
job, with a process set of the two first ranks still made: its set must not keep it from telling
them. Usage: set_leaving.py; rank 0 prints what its barrier raised."""

import ringreduce as rr

rr.init()
pair = rr.add_process_set([0, 1])
if rr.rank() == 1:
    raise SystemExit(0)  # leaves without the barrier; shutdown() at exit closes both domains
try:
    rr.barrier()
except rr.PeerExitedError as error:
    print(f"rank {rr.rank()} caught PeerExitedError: {error}", flush=True)
