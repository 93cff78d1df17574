"""The elastic worker's training replayed in one process (tests/jobs/resilience/elastic_train.py),
and the discovery scripts and event lines of elastic jobs: shared by the elastic tests on one host
and on the two-host cluster."""

import importlib.util
import json
import os
import stat

import torch

from launch import JOBS

_spec = importlib.util.spec_from_file_location("elastic_train", os.path.join(JOBS, "resilience", "elastic_train.py"))
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def replay(epochs, schedule):
    """The worker's training in one process, where the generation that resumed at step s ran
    schedule[s] ranks: each step averages the ranks' mean gradients over the batches an
    ElasticSampler gives them. Returns (weight, bias)."""
    dataset = worker.data()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step, epoch, processed, size = 0, 0, 0, schedule[0]
    while epoch < epochs:
        size = schedule.get(step, size)
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(1 + epoch)).tolist()
        rest, start = order[processed:], processed
        slices = [rest[r::size][:len(rest) // size] for r in range(size)]
        resized = False
        for j in range(len(slices[0]) // worker.BATCH):
            if j > 0 and step in schedule:
                resized = True
                break
            optimizer.zero_grad()
            grads = [torch.zeros_like(p) for p in model.parameters()]
            for part in slices:
                model.zero_grad()
                x, y = dataset[part[j * worker.BATCH:(j + 1) * worker.BATCH]]
                torch.nn.functional.mse_loss(model(x), y).backward()
                grads = [g + p.grad for g, p in zip(grads, model.parameters(), strict=True)]
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g / size
            optimizer.step()
            step += 1
            processed = start + (j + 1) * worker.BATCH * size
        if not resized:
            epoch, processed = epoch + 1, 0
    return model.weight.detach().flatten().tolist(), model.bias.item()


def events(job, kind):
    """The worker's `kind` lines (rank 0's, or every rank's FINAL), parsed."""
    lines = [line.split(" ", 1)[1] for rank in range(8) for line in job.lines_of(rank) if line.startswith(kind + " ")]
    return [json.loads(line) for line in lines]


def discovery_script(tmp_path, lines):
    """A discovery script that prints a file the test (or the worker) can change."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(line + "\n" for line in lines))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, hosts


def assert_matches_replay(job, epochs):
    resumed = events(job, "RESUMED")
    schedule = {r["step"]: r["size"] for r in resumed}
    weight, bias = replay(epochs, schedule)
    finals = events(job, "FINAL")
    assert len(finals) == resumed[-1]["size"]
    # What a mismatch needs to be understood: the generations, the commits, and what rrun said.
    story = "\n".join([json.dumps(r) for r in resumed] + [line for line in job.lines_of(0) if line.startswith("COMMIT")]
                      + [line for line in job.stderr.splitlines() if line.startswith("rrun:")])
    for final in finals:
        torch.testing.assert_close(final["weight"], weight, rtol=1e-9, atol=1e-12, msg=lambda m: f"{m}\n{story}")
        torch.testing.assert_close(final["bias"], bias, rtol=1e-9, atol=1e-12, msg=lambda m: f"{m}\n{story}")
    return resumed
