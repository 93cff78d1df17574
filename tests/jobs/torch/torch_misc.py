"""The rest of ringreduce.torch under real ranks, one mode after another in one job: each saves to
OUT_DIR/MODE/rankR.pt and reports with its mode. Usage: torch_misc.py MODE[,MODE...] OUT_DIR"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import torch_cases  # noqa: E402

import ringreduce.torch as rr  # noqa: E402

rr.init()
rank, size = rr.rank(), rr.size()
out = sys.argv[2]


def save(obj):
    os.makedirs(os.path.join(out, mode), exist_ok=True)
    torch.save(obj, os.path.join(out, mode, f"rank{rank}.pt"))


def report(**values):
    print("REPORT " + json.dumps({"mode": mode, **values}), flush=True)


def collectives():
    results = {}
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.float16):
        results[f"allreduce-{dtype}"] = rr.allreduce(torch.arange(6, dtype=dtype) * (rank + 1), op=rr.Sum)
    in_place = torch.full((3, 2), float(rank))
    assert rr.allreduce_(in_place, op=rr.Max) is in_place
    results["allreduce_"] = in_place
    bf16 = torch.full((4,), rank + 1.5, dtype=torch.bfloat16)
    rr.allreduce_(bf16, op=rr.Sum)
    results["allreduce_-bf16"] = bf16
    results["grouped"] = rr.grouped_allreduce([torch.ones(2) * rank, torch.ones(3) * rank], op=rr.Sum)
    results["allgather"] = rr.allgather(torch.full((rank + 1, 2), rank, dtype=torch.int32))
    results["broadcast"] = rr.broadcast(torch.arange(4.0) + rank, root_rank=1)
    target = torch.arange(4.0) + rank
    rr.broadcast_(target, root_rank=1)
    results["broadcast_"] = target
    results["alltoall"] = rr.alltoall(torch.arange(2 * size) + 10 * rank)
    results["alltoall-splits"] = rr.alltoall(torch.arange(3) + 10 * rank, splits=[1, 2] if rank == 0 else [2, 1])
    results["reducescatter"] = rr.reducescatter(torch.ones(2 * size + 1, 2) * (rank + 1), op=rr.Sum)
    handle = rr.allreduce_async(torch.ones(2), op=rr.Sum)
    results["async"] = rr.synchronize(handle)
    results["poll"] = rr.poll(handle)
    save(results)


def overlap():
    class Tap(torch.autograd.Function):
        """The identity, running `action` when backward reaches it."""
        @staticmethod
        def forward(ctx, x, action):
            ctx.action = action
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            ctx.action()
            return grad, None

    def slow_early_layers():  # stands for the expensive early layers of a real network
        time.sleep(0.3)

    def done():  # by the engine, or (a small plain call) in program order
        stats = rr.engine_stats()
        return stats["tensors"] + stats["in_program_order"]

    def backward_finished():  # the tap at the input runs after every layer's backward
        seen.append(done() - before)

    first, last = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
    params = [("first.weight", first.weight), ("first.bias", first.bias), ("last.weight", last.weight),
              ("last.bias", last.bias)]
    opt = rr.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1), named_parameters=params)
    seen = []
    rr.barrier()  # start backward together, as ranks in a training loop do
    before = done()
    x = torch.randn(4, 8, requires_grad=True)
    last(Tap.apply(first(Tap.apply(x, backward_finished)), slow_early_layers)).sum().backward()
    opt.step()
    report(done_before_backward_ended=seen[0], done_after_step=done() - before)


def broadcast():
    torch.manual_seed(rank)  # every rank starts from a different model
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    adam = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.randn(5, 4) * (rank + 1)).sum().backward()
    for _ in range(rank + 1):  # different moments and step counts
        adam.step()
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    fresh = torch.optim.Adam(list(net.parameters()) + [frozen], lr=0.5 + rank)
    rr.broadcast_optimizer_state(fresh, root_rank=0)  # before its first step
    rr.broadcast_parameters(net.state_dict(), root_rank=0)
    rr.broadcast_optimizer_state(adam, root_rank=0)
    save({"model": net.state_dict(), "adam": adam.state_dict(), "fresh": fresh.state_dict(),
          "frozen_grad": frozen.grad, "zero_grads": [p.grad for p in net.parameters()]})


def unused():
    torch.manual_seed(0)
    used, sometimes, never = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    embedding = torch.nn.Embedding(4, 2, sparse=True)
    named = [(f"{m}.{n}", p) for m, mod in (("used", used), ("sometimes", sometimes), ("never", never),
                                            ("embedding", embedding)) for n, p in mod.named_parameters()]
    opt = rr.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1), named_parameters=named)
    for _ in range(3):
        opt.zero_grad()
        x = torch.ones(2, 3) * (rank + 1)
        loss = used(x).sum()
        if rank == 0:  # the other ranks never use these
            loss = loss + sometimes(x).sum() + embedding(torch.tensor([1])).sum()
        loss.backward()
        opt.step()
    report(never_grad_is_none=never.weight.grad is None)
    save({name: p.detach() for name, p in named})


def mismatch():
    net = torch.nn.Linear(4, 3 if rank == 0 else 5)
    opt = rr.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters())
    net(torch.ones(2, 4)).sum().backward()
    try:
        opt.step()
    except rr.MismatchError as error:
        report(error=str(error))
    embedding = torch.nn.Embedding(4, 2, sparse=rank == 0)  # a gradient sparse on rank 0 only
    opt = rr.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=0.1),
                                  named_parameters=[("embedding.weight", embedding.weight)])
    embedding(torch.tensor([1])).sum().backward()
    try:
        opt.step()
    except ValueError as error:
        report(sparse_error=str(error))


def scheduler_and_clipping():
    net = torch_cases.model()
    opt = rr.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    inputs, labels = torch_cases.data()
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(inputs[rank::size]), labels[rank::size]).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.01)
        with opt.skip_synchronize():
            opt.step()
        scheduler.step()
    report(lrs=lrs, is_sgd=isinstance(opt, torch.optim.SGD), keys=sorted(opt.state_dict()))
    save({name: p.detach() for name, p in net.named_parameters()})


def syncbn():
    torch.manual_seed(3)
    whole = torch.randn(8, 3, 4, 4) * 2 + 1
    weights = torch.randn(8, 3, 4, 4)
    mine = slice(rank * 8 // size, (rank + 1) * 8 // size)
    bn = rr.SyncBatchNorm(3, momentum=0.3)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
    x = whole[mine].clone().requires_grad_(True)
    y = bn(x)
    (y * weights[mine]).sum().backward()
    save({"y": y.detach(), "grad_x": x.grad, "grad_weight": bn.weight.grad, "grad_bias": bn.bias.grad,
          "running_mean": bn.running_mean, "running_var": bn.running_var})


def error_feedback():
    # One parameter, SGD with lr 1, gradients of known values: the trajectory is exactly computable.
    w = torch.zeros(64, requires_grad=True)
    feedback = rr.Compression.error_feedback(rr.Compression.fp16)
    optimizer = rr.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                        compression=feedback)
    trajectory = []
    for step in range(4):
        optimizer.zero_grad()
        (w * torch.from_numpy(torch_cases.feedback_gradient(rank, step))).sum().backward()
        optimizer.step()
        trajectory.append(w.detach().clone())
    save({"trajectory": torch.stack(trajectory), "residual": feedback.residuals["grad.w"]})  # by gradient name


def topk():
    # As error-feedback, with the top 10 % (6 of 64) of each corrected gradient of an 8 x 8 matrix
    # sent, gathered; a bias vector of 4 travels whole, averaged.
    w, b = torch.zeros(8, 8, requires_grad=True), torch.zeros(4, requires_grad=True)
    feedback = rr.Compression.error_feedback(rr.Compression.topk(0.1))
    optimizer = rr.DistributedOptimizer(torch.optim.SGD([w, b], lr=1.0), named_parameters=[("w", w), ("b", b)],
                                        compression=feedback)
    trajectory, biases, wire = [], [], []
    for step in range(4):
        optimizer.zero_grad()
        before = rr.engine_stats()["bytes"]  # before backward: its hooks submit, and the engine may run them at once
        gradient = torch.from_numpy(torch_cases.feedback_gradient(rank, step))
        ((w * gradient.reshape(8, 8)).sum() + (b * gradient[:4]).sum()).backward()
        optimizer.step()
        wire.append(rr.engine_stats()["bytes"] - before)
        trajectory.append(w.detach().reshape(-1).clone())
        biases.append(b.detach().clone())
    save({"trajectory": torch.stack(trajectory), "biases": torch.stack(biases),
          "residual": feedback.residuals["grad.w"].reshape(-1), "wire": wire})


def narrow_kernels():
    # numpy allreduces whose wire is float16 or bfloat16 (and float16 inputs), once with numpy's
    # kernels and once with the torch kernels ringreduce.torch lends the core: saved as float32.
    import numpy as np

    import ringreduce as core
    from ringreduce.numerics import kernels, reduction
    from ringreduce.torch.kernels import TorchKernels

    results = {}
    for label, lent in (("numpy", None), ("torch", TorchKernels())):
        kernels.lend(lent)
        assert (reduction.ufunc(core.Sum, np.float16) is np.add) == (lent is None)
        for count in (1000, 300_000):
            values = torch_cases.narrow_values(rank, count)
            for compression in ("fp16", "bf16"):
                for op in ("Sum", "Average"):
                    got = core.allreduce(values, op=getattr(core, op),
                                         compression=getattr(core.Compression, compression))
                    results[f"{label}-{compression}-{op}-{count}"] = torch.from_numpy(got)
            halves = core.allreduce(values.astype(np.float16), op=core.Sum)
            results[f"{label}-float16-Sum-{count}"] = torch.from_numpy(halves.astype(np.float32))
    save(results)


def powersgd_bfloat16():
    # bfloat16 gradients reach the core as float32 copies: the average must come back into them.
    w = torch.zeros(16, 16, dtype=torch.bfloat16, requires_grad=True)
    optimizer = rr.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                        compression=rr.PowerSGD(start_powerSGD_iter=1))
    optimizer.zero_grad()
    (w * torch.full((16, 16), float(rank + 1), dtype=torch.bfloat16)).sum().backward()
    optimizer.step()
    save({"w": w.detach().float()})



for mode in sys.argv[1].split(","):  # each mode is the function of its name
    globals()[mode.replace("-", "_")]()
