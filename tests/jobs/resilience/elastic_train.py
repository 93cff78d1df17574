"""An elastic job: least squares in float64 with SGD and momentum, 4 samples per rank a step from an
ElasticSampler, a commit every 3 steps and at each epoch's end. It prints what the test replays: each
generation's start (RESUMED: size, and the step, epoch and position it resumed from), each commit,
each step's time, and at the end the parameters. A failure is asked for with arguments:

    elastic_train.py EPOCHS [--die HOW HOST STEP] [--plan JSON] [--grow-file FILE STEP LINE] [--sleep S]

--die: in generation 0 the ranks on HOST (a host name, or "rank1" for rank 1 alone) fail at STEP
(HOW: kill, segfault, exception, exit; hang: sleep until killed; cut:SECONDS: cut the test
cluster's link, and mend it SECONDS later). --plan: a list of [HOW, PHASE], one per generation: in
that generation rank 1 fails so, two steps after it resumed, in PHASE (forward: before a step's
forward; allreduce: after its backward, while the others average; commit: inside a commit, written
but not confirmed; resize: in a reset callback, before training, once rank 0 has printed RESUMED).
--grow-file: at STEP of generation 0, rank 0 appends LINE to FILE (which the discovery script
prints) and waits until rrun has told the ranks."""

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import time

import numpy as np
import torch

import ringreduce.torch as rr

BATCH = 4
TORCHRUN = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # as rrun sets them for each generation


def data():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((192, 4))
    y = x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.standard_normal(192)
    return torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y).unsqueeze(1))


def die(how):
    print(f"DYING {json.dumps({'time': time.time(), 'how': how})}", flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "segfault":
        ctypes.string_at(0)
    elif how == "exception":
        raise RuntimeError("the training step failed")
    elif how == "exit":
        os._exit(3)
    elif how == "hang":
        time.sleep(3600)
    elif how.startswith("cut:"):
        cut_link(float(how[4:]))


# The test cluster's link (tests/cluster/up.sh) cut silently, both ways: a link taken down would
# tell both ends at once; this kernel has no netem, but a token bucket that refills at a byte a
# second with room for no packet drops everything without a word.
SHAPE = "tc qdisc replace dev rrnet0 root tbf rate 8bit burst 100 latency 1ms"
BOTH_ENDS = "{0} && ip netns exec rr-hosta {0}"


def cut_link(seconds):
    """From hostb: cut the link, and mend it `seconds` later (from a process that outlives this one)."""
    mend = BOTH_ENDS.format("tc qdisc del dev rrnet0 root")
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; {mend}"], start_new_session=True, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    subprocess.run(["sh", "-c", BOTH_ENDS.format(SHAPE)], check=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("epochs", type=int)
    parser.add_argument("--die", nargs=3, metavar=("HOW", "HOST", "STEP"))
    parser.add_argument("--plan", type=json.loads, default=[])
    parser.add_argument("--grow-file", nargs=3, metavar=("FILE", "STEP", "LINE"))
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    rr.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, dtype=torch.float64)
    optimizer = rr.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                        named_parameters=model.named_parameters())
    dataset = data()
    sampler = rr.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True)
    state = rr.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)
    generation = int(os.environ.get("RINGREDUCE_ELASTIC_GENERATION", "0"))
    resets = []
    state.register_reset_callbacks([lambda: resets.append(rr.size())])
    planned = args.plan[generation] if generation < len(args.plan) else (None, None)
    how, phase = planned if rr.rank() == 1 else (None, None)
    # Rank 1's failure in a reset callback comes within a few ms of rank 0's RESUMED line (measured
    # -4 to +2 ms); on a loaded machine the failure could end the generation before rank 0 prints it.
    # A barrier puts the line first: rank 1 enters it before failing, the others after rank 0 printed.
    reported = rr.barrier if planned[1] == "resize" else (lambda: None)
    start = []  # the step this generation resumed from

    def fail_in(where):
        if phase == where and state.step >= start[0] + 2:
            die(how)

    if phase == "resize":
        state.register_reset_callbacks([lambda: (reported(), die(how))])
    if phase == "commit":
        confirm = state._store.confirm
        state._store.confirm = lambda *a, **k: (fail_in("commit"), confirm(*a, **k))[1]

    @rr.elastic.run
    def train(state):
        start.append(state.step)
        if rr.rank() == 0:
            print("RESUMED " + json.dumps({"generation": generation, "size": rr.size(), "step": state.step,
                                           "epoch": state.epoch, "processed": sampler.processed,
                                           "resets": resets, "time": time.time(),
                                           "torchrun": {name: os.environ.get(name) for name in TORCHRUN}}),
                  flush=True)
        if rr.rank() != 1:
            reported()
        for epoch in range(state.epoch, args.epochs):
            state.epoch = epoch
            for batch_idx, (x, y) in enumerate(loader):
                if args.die and generation == 0 and state.step == int(args.die[2]) and \
                        args.die[1] in (socket.gethostname(), f"rank{rr.rank()}"):
                    die(args.die[0])
                if args.grow_file and generation == 0 and state.step == int(args.grow_file[1]) and rr.rank() == 0:
                    with open(args.grow_file[0], "a") as f:
                        f.write(args.grow_file[2] + "\n")
                    time.sleep(2.5)  # rrun's discovery (every second) tells the ranks before their next commit
                fail_in("forward")
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                fail_in("allreduce")
                optimizer.step()
                state.step += 1
                sampler.record_batch(batch_idx, BATCH)
                if rr.rank() == 0:
                    print(f"STEP {json.dumps({'step': state.step, 'size': rr.size(), 'time': time.time()})}",
                          flush=True)
                time.sleep(args.sleep)
                if state.step % 3 == 0:
                    state.commit()
                    if rr.rank() == 0:
                        print(f"COMMIT {state.step}", flush=True)
            sampler.set_epoch(epoch + 1)
            state.epoch = epoch + 1  # a generation that resumes from this commit starts the next epoch
            state.commit()
            if rr.rank() == 0:
                print(f"COMMIT {state.step} epoch end", flush=True)

    train(state)
    print("FINAL " + json.dumps({"rank": rr.rank(), "host": socket.gethostname(), "size": rr.size(),
                                 "step": state.step, "weight": model.weight.detach().flatten().tolist(),
                                 "bias": model.bias.item()}), flush=True)


if __name__ == "__main__":
    main()
