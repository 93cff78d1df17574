"""The cluster simulator as pure logic: its allreduce is the cost model's, a step overlaps the
allreduces with the backward pass as the engine would, fusion and the cycle as configured, and
runs at the pace of the job's slowest GPU."""

import dataclasses
import subprocess
import sys

import pytest

from ringreduce.algorithms import cost
from ringreduce.planning import simulator

# GPUs of one speed, so that the timeline's own tests come out in round numbers.
CLUSTER = simulator.Cluster(nodes=4, gpus_per_node=4, intra_gbytes=100.0, intra_latency=2e-6, inter_gbit=100.0,
                            inter_latency=5e-6, gpu_spread=0.0)


def test_an_allreduce_costs_what_the_cost_model_says():
    model = CLUSTER.model()
    assert model.shape == cost.JobShape(16, 4)
    seconds, family = CLUSTER.allreduce(64 << 20)
    assert seconds == min(model.allreduce(f, 64 << 20) for f in simulator.FAMILIES)
    assert CLUSTER.allreduce(64 << 20, "ring") == (model.allreduce("ring", 64 << 20), "ring")
    # The ring over 16 GPUs moves 2 * 15/16 of the array through each node's link.
    link_seconds = 2 * 15 / 16 * (64 << 20) * 8 / 100e9
    assert link_seconds < CLUSTER.allreduce(64 << 20, "ring")[0] < 1.5 * link_seconds


def test_one_gradient_at_the_end_of_the_backward_pass_is_wholly_exposed():
    work = simulator.Workload("one", forward=0.010, layers=((1 << 20, 0.020),))
    engine = simulator.Engine(fusion_bytes=64 << 20, cycle=0.004)
    step = simulator.step(CLUSTER, work, "ring", engine)
    allreduce = CLUSTER.allreduce(1 << 20, "ring")[0]
    ready_tick = 0.032  # the first cycle at or after 30 ms
    assert step.seconds == pytest.approx(ready_tick + allreduce)
    assert step.exposed == pytest.approx(ready_tick + allreduce - 0.030)
    assert step.efficiency == pytest.approx(0.030 / step.seconds)


def test_gradients_ready_together_are_fused_up_to_the_threshold():
    work = simulator.Workload("many", forward=0.0, layers=tuple((10 << 20, 0.0) for _ in range(10)))
    step = simulator.step(CLUSTER, work, "ring", simulator.Engine(fusion_bytes=32 << 20, cycle=1e-3))
    assert len(step.families) == 4  # 3 + 3 + 3 + 1 gradients of 10 MiB
    free = simulator.step(dataclasses.replace(CLUSTER, inter_gbit=1e9, intra_gbytes=1e9, inter_latency=0,
                                              intra_latency=0, call_seconds=0, reduce_gbytes=1e9),
                          simulator.Workload("x", 0.01, ((1 << 20, 0.05),)), "ring", simulator.Engine(cycle=1e-3))
    assert free.efficiency == pytest.approx(1.0, abs=1e-6)


def test_communication_hidden_behind_the_backward_pass_costs_nothing():
    """Small gradients ready early in a long backward pass: the step is the computation."""
    layers = ((1 << 20, 0.001),) + ((0, 0.100),)
    step = simulator.step(CLUSTER, simulator.Workload("early", 0.05, layers), None)
    assert step.seconds == pytest.approx(0.151) and step.exposed == 0


def test_the_step_runs_at_the_pace_of_the_slowest_gpu():
    """Speeds spread evenly over 8 % about the median: the least of n of them is expected 4 % (n-1)/(n+1)
    below it, so a compute-bound step loses that share at any scale, and nothing on one GPU."""
    spread = dataclasses.replace(CLUSTER, gpu_spread=0.08)
    assert spread.slowest_speed() == pytest.approx(1 - 0.04 * 15 / 17)
    assert spread.with_gpus(1).slowest_speed() == 1.0 and simulator.Cluster(1, 1, 1, 0, 1, 0).gpu_spread == 0.08
    early = simulator.Workload("early", 0.05, ((1 << 20, 0.001), (0, 0.100)))
    assert simulator.step(spread, early).seconds == pytest.approx(0.151 / spread.slowest_speed())
    assert simulator.step(spread, early).efficiency == pytest.approx(spread.slowest_speed())
    # A step bound by its allreduce loses only the delay of the gradient it waits for: the rest of
    # the slowest GPU's backward pass hides behind the communication.
    bound = simulator.Workload("bound", 0.05, ((1 << 30, 0.001), (0, 0.05)))
    engine = simulator.Engine(cycle=1e-6)
    one_speed = simulator.step(CLUSTER, bound, "ring", engine)
    slower = simulator.step(spread, bound, "ring", engine).seconds - one_speed.seconds
    assert slower == pytest.approx(0.051 * (1 / spread.slowest_speed() - 1), rel=0.01)


def test_scaling_covers_2_to_16384_gpus_with_the_model_choice_about_the_best():
    work = simulator.Workload.even("m", 100e6, 50, 0.1)
    table = simulator.scaling(CLUSTER, work)
    assert [gpus for gpus, _ in table[None]] == simulator.SCALES and simulator.SCALES[-1] == 16384
    for index in range(len(simulator.SCALES)):  # each allreduce the cheapest; fusion may then group differently
        best = max(rows[index][1].efficiency for family, rows in table.items() if family)
        assert table[None][index][1].efficiency >= best - 0.01
    assert CLUSTER.with_gpus(2) == dataclasses.replace(CLUSTER, nodes=1, gpus_per_node=2)
    assert CLUSTER.with_gpus(1024).nodes == 256


def test_compression_halves_the_bytes_and_helps_a_bandwidth_bound_model():
    work = simulator.Workload.even("big", 500e6, 16, 0.4)
    half = work.compressed(0.5)
    assert half.gradient_bytes == work.gradient_bytes / 2 and half.step == work.step
    cluster = CLUSTER.with_gpus(512)
    assert simulator.step(cluster, half).efficiency > simulator.step(cluster, work).efficiency


def test_the_command_line_prints_every_scale():
    def run(*extra):
        return subprocess.run([sys.executable, "-m", "ringreduce.planning.simulator", "--gradient-mb", "98",
                               "--step-ms", "100",
                               *extra], capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()

    out = run()
    assert out[0].split()[:3] == ["GPUs", "chosen", "ring"]
    assert [int(line.split()[0]) for line in out[1:]] == simulator.SCALES
    # 2 GPUs of the default spread: the slower is expected 8 %/6 below the median; of one speed, none.
    assert float(out[1].split()[1].rstrip("%")) < 100 * (1 - 0.08 / 6) + 0.05
    assert float(run("--gpu-spread", "0")[1].split()[1].rstrip("%")) > float(out[1].split()[1].rstrip("%"))
