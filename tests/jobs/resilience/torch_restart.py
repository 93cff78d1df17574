"""20 training steps with a checkpoint committed every 5; rank 1 kills itself at step 7 on the
job's first run when told to. Prints each step it runs; saves the final parameters.
Usage: torch_restart.py KILL|NOKILL CHECKPOINT_DIR OUT_DIR"""

import os
import signal
import sys

import torch

import ringreduce.torch as rr

kill, directory, out = sys.argv[1] == "KILL", sys.argv[2], sys.argv[3]
rr.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = rr.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                    named_parameters=model.named_parameters())
rr.broadcast_parameters(model.state_dict(), root_rank=0)
restored = rr.checkpoint.restore(directory, model, optimizer)
start = 0 if restored is None else restored["step"] + 1
print(f"run {os.environ['RINGREDUCE_RESTART_COUNT']} starts at step {start}", flush=True)
for step in range(start, 20):
    if kill and rr.rank() == 1 and step == 7 and os.environ["RINGREDUCE_RESTART_COUNT"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    generator = torch.Generator().manual_seed(1000 * step + rr.rank())  # this step's batch on this rank
    x = torch.randn(16, 6, generator=generator)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    optimizer.step()
    print(f"ran step {step}", flush=True)
    if step % 5 == 4:
        rr.checkpoint.save(directory, step, model, optimizer, keep=2)
torch.save(model.state_dict(), os.path.join(out, f"rank{rr.rank()}.pt"))
