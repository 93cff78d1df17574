"""The simulator's training step (ringreduce.planning.simulator.step: the backward pass overlapped with the
engine's fused allreduces) against a measured one. Each rank runs a synthetic model whose passes
wait out their layers' times asleep, as the host thread of a GPU job waits for its kernels, and
hands each gradient to the engine the moment its layer is done; the prediction takes the same
layers and the calibrated profile of the machines the job runs on, in place of a cluster
description, and the runtime's own choice of family for each fused buffer. Its compute is what the
same steps measure without the allreduces (as a single GPU's step is measured), taken in turns
with the steps measured with them: these machines' speed drifts within minutes.

    rrun -np 2 --calibrate --profile p.json && rrun -np 2 python benchmarks/simulated_step.py --profile p.json

Appends each workload's measured and predicted step to benchmarks/results/simulated_step.jsonl.
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import time

import numpy as np

import ringreduce as rr
from ringreduce.algorithms import cost
from ringreduce.planning import profiles, simulator

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "simulated_step.jsonl"
MIB = 1 << 20


def workloads():
    """Three shapes of model, each a simulator.Workload."""
    def layers(sizes_mib, backward_ms):
        return tuple((int(s * MIB), backward_ms / 1e3) for s in sizes_mib)

    return [
        # Small gradients behind a long backward pass: the allreduces hide behind it.
        simulator.Workload("compute-bound", 0.030, layers([0.125] * 24, 4.0)),
        # Large gradients, evenly spread: the link sets the step.
        simulator.Workload("bandwidth-bound", 0.015, layers([1.0] * 24, 2.0)),
        # Large layers first in the backward pass (a classifier's), small ones after (VGG's shape).
        simulator.Workload("large-first", 0.020, layers([8.0, 4.0] + [0.25] * 16, 3.0)),
    ]


class MeasuredMachine:
    """The simulator's cluster as the calibrated profile of this job's machines sees it: each fused
    buffer goes to the family the runtime would choose for it."""

    def __init__(self, profile, shape):
        self.model = cost.Model(profile, shape)

    def slowest_speed(self):
        return 1.0  # the measured step runs at its slowest rank's pace already

    def allreduce(self, nbytes, family=None):
        name = family or self.model.choose("allreduce", nbytes)
        return self.model.allreduce(name, nbytes), name


def measured_step(workload, grads, communicate):
    """One step's seconds on the slowest rank: the forward pass, then the backward pass handing
    each gradient to the engine as its layer ends (where `communicate`), then waiting for every
    allreduce."""
    rr.barrier()
    start = time.perf_counter()
    time.sleep(workload.forward)
    handles = []
    for index, ((_, seconds), grad) in enumerate(zip(workload.layers, grads, strict=True)):
        time.sleep(seconds)
        if communicate:
            handles.append(rr.allreduce_async_(grad, op=rr.Sum, name=f"{workload.name}.{index}"))
    for handle in handles:
        rr.synchronize(handle)
    return float(rr.allreduce(np.array([time.perf_counter() - start]), op=rr.Max, name="step seconds")[0])


def as_measured(workload, seconds):
    """`workload` with every layer's time (and the forward pass) scaled to a step of `seconds`."""
    factor = seconds / workload.step
    return simulator.Workload(workload.name, workload.forward * factor,
                              tuple((nbytes, layer * factor) for nbytes, layer in workload.layers))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", required=True, help="the profile of these machines, from rrun --calibrate")
    parser.add_argument("--label", default="")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    rr.init()
    profile = profiles.load(args.profile)
    hosts = rr.size() // rr.local_size()
    machine = MeasuredMachine(profile, cost.JobShape(rr.size(), hosts))
    engine = simulator.Engine()  # the runtime's defaults: 128 MiB buffers, a 1 ms cycle
    rows = []
    for workload in workloads():
        grads = [np.zeros(nbytes // 4, np.float32) for nbytes, _ in workload.layers]  # summed: zeros stay zeros
        measured_step(workload, grads, True)  # the names' first announcement, not counted
        pairs = [(measured_step(workload, grads, False), measured_step(workload, grads, True))
                 for _ in range(args.steps)]
        compute, steps = statistics.median(p[0] for p in pairs), [p[1] for p in pairs]
        predicted = simulator.step(machine, as_measured(workload, compute), engine=engine)
        rows.append({"label": args.label, "workload": workload.name, "ranks": rr.size(), "hosts": hosts,
                     "gradient_bytes": workload.gradient_bytes, "compute": compute,
                     "median": statistics.median(steps), "min": min(steps), "max": max(steps),
                     "predicted": predicted.seconds, "exposed": predicted.exposed,
                     "buffers": len(predicted.families), "families": sorted(set(predicted.families))})
    if rr.rank() == 0:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=pathlib.Path(__file__).parent).stdout.strip()
        with RESULTS.open("a") as out:
            for row in rows:
                out.write(json.dumps({"commit": commit, "date": time.strftime("%Y-%m-%d"), **row}) + "\n")
                print(f"{row['workload']:16s} {row['gradient_bytes'] / MIB:6.1f} MiB"
                      f"  compute {row['compute'] * 1e3:6.1f} ms  measured {row['median'] * 1e3:7.1f} ms"
                      f" ({row['min'] * 1e3:.1f}-{row['max'] * 1e3:.1f})"
                      f"  predicted {row['predicted'] * 1e3:7.1f} ms (exposed {row['exposed'] * 1e3:.1f}, "
                      f"{row['buffers']} buffers, {'/'.join(row['families'])})"
                      f"  ratio {row['predicted'] / row['median']:.2f}", flush=True)
    rr.shutdown()


if __name__ == "__main__":
    main()
