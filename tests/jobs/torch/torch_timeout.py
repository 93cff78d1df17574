"""A group whose timeout passes: rank 0 calls all_reduce while rank 1 sleeps past the timeout
given to init_process_group; rank 0 prints what it raised and fails the job (rrun then ends rank
1), for tests/jobs/torch/test_torch_distributed.py."""

import datetime
import sys
import time

import torch
import torch.distributed as dist

import ringreduce.torch  # noqa: F401 - registers the backend

dist.init_process_group("ringreduce", timeout=datetime.timedelta(seconds=float(sys.argv[1])))
if dist.get_rank() == 1:
    time.sleep(60)
try:
    dist.all_reduce(torch.ones(3))
except Exception as error:  # noqa: BLE001 - what the test checks
    print(f"raised {type(error).__name__}: {error}", flush=True)
    sys.exit(3)
