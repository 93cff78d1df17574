"""What data-parallel training would do on a cluster one plans for, before one has it: the time of
each allreduce under each algorithm, and the step time and scaling efficiency from 2 to 16,384
GPUs, from the cost model (algorithms/cost.py) with the cluster's link figures in place of a
calibrated profile.

A step: the forward pass, then the backward pass, during which each layer's gradient becomes
ready in turn; the engine wakes every cycle, fuses the gradients ready by then into buffers of up
to the fusion threshold and allreduces them one after another, overlapping the rest of the
backward pass; the step ends when the last allreduce does. Every GPU waits at each allreduce for
the slowest, so the whole step runs at the pace of the job's slowest GPU (GPUs of one model differ
in speed: Cluster.gpu_spread). Efficiency is the single GPU's step time over this one (weak
scaling: the batch per GPU stays the same).

    python -m ringreduce.planning.simulator --gpus-per-node 8 --intra-gbytes 150 --inter-gbit 200 \\
        --gradient-mb 98 --layers 160 --step-ms 100

docs/cost_model.md checks it against measurement here and against Horovod's published scaling.
"""

import argparse
import dataclasses
import math

from ringreduce.algorithms import cost

# The families a GPU cluster runs its allreduce with (MPI's own and shared memory are host paths).
FAMILIES = ("ring", "halving_doubling", "tree", "hierarchical")
SCALES = [1 << i for i in range(1, 15)]  # 2 to 16,384 GPUs
# How far apart the fastest and slowest GPUs of one model and SKU run in a cluster, as a share of
# the median GPU's speed, outliers aside: 8 % on average over the clusters and applications that
# Sinha et al. measured (SC'22, "Not All GPUs Are Created Equal", V100 and MI60 clusters; up to 22 %,
# and single outliers 1.5x slower than the median, which this leaves out).
GPU_SPREAD = 0.08


@dataclasses.dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    intra_gbytes: float  # GB/s between the GPUs of a node (NVLink, PCIe)
    intra_latency: float  # seconds per message inside a node
    inter_gbit: float  # Gbit/s of each node's network link
    inter_latency: float  # seconds per message across nodes
    reduce_gbytes: float = 250.0  # GB/s at which a GPU adds one array into another
    call_seconds: float = 20e-6  # a collective's fixed cost (kernel launches, the library's setup)
    gpu_spread: float = GPU_SPREAD  # fastest to slowest GPU, a share of the median's speed

    def slowest_speed(self):
        """The job's slowest GPU's speed, a share of the median one's: the expected least of `gpus`
        speeds spread evenly over gpu_spread about the median (the median itself for one GPU)."""
        return 1 - self.gpu_spread / 2 * (self.gpus - 1) / (self.gpus + 1)

    @property
    def gpus(self):
        return self.nodes * self.gpus_per_node

    def with_gpus(self, gpus):
        """The same kind of cluster with `gpus` GPUs: whole nodes, or part of one."""
        per_node = min(self.gpus_per_node, gpus)
        return dataclasses.replace(self, nodes=math.ceil(gpus / per_node), gpus_per_node=per_node)

    def model(self):
        inside = cost.PerByte(1 / (self.intra_gbytes * 1e9), 1 / (self.intra_gbytes * 1e9))
        across = cost.PerByte(8 / (self.inter_gbit * 1e9), 8 / (self.inter_gbit * 1e9))
        reduce = cost.PerByte(1 / (self.reduce_gbytes * 1e9), 1 / (self.reduce_gbytes * 1e9))
        profile = cost.Profile(
            host=cost.Link(self.intra_latency, inside), network=cost.Link(self.inter_latency, across),
            mpi=cost.Link(self.intra_latency, inside), combine=reduce, copy=inside, barrier=self.intra_latency,
            calls=dict.fromkeys(FAMILIES, self.call_seconds), cache_bytes=1 << 62, cores=self.gpus_per_node,
            shm_piece_bytes=1 << 62, source="cluster description")
        return cost.Model(profile, cost.JobShape(self.gpus, self.nodes))

    def allreduce(self, nbytes, family=None):
        """(seconds, family) of one allreduce: under `family`, or the cheapest the model finds."""
        model = self.model()
        if self.gpus == 1:
            return 0.0, family or "none"
        names = [family] if family else [f for f in FAMILIES if f in model.candidates("allreduce")]
        return min((model.allreduce(name, nbytes), name) for name in names)


@dataclasses.dataclass(frozen=True)
class Workload:
    """One GPU's training step: its forward seconds, and per layer in the order the backward pass
    reaches them, (gradient bytes, backward seconds)."""

    name: str
    forward: float
    layers: tuple

    @property
    def step(self):
        return self.forward + sum(seconds for _, seconds in self.layers)

    @property
    def gradient_bytes(self):
        return sum(nbytes for nbytes, _ in self.layers)

    def compressed(self, ratio):
        """The same model with `ratio` of its gradient bytes on the wire (fp16: 0.5)."""
        return dataclasses.replace(self, layers=tuple((nbytes * ratio, seconds) for nbytes, seconds in self.layers))

    @classmethod
    def even(cls, name, gradient_bytes, layers, step_seconds, forward_share=1 / 3):
        """A model known only by its totals: `layers` layers of equal size and backward time."""
        backward = step_seconds * (1 - forward_share)
        return cls(name, step_seconds * forward_share, tuple((gradient_bytes / layers, backward / layers)
                                                             for _ in range(layers)))


@dataclasses.dataclass(frozen=True)
class Engine:
    """The background engine's knobs: Horovod's defaults are 64 MiB and 5 ms, ringreduce's 128 MiB and 1 ms."""

    fusion_bytes: int = 128 << 20
    cycle: float = 1e-3


@dataclasses.dataclass(frozen=True)
class Step:
    seconds: float
    efficiency: float
    exposed: float  # communication not hidden behind the backward pass
    families: tuple  # the family of each fused allreduce


def step(cluster, workload, family=None, engine=Engine()):
    """The predicted training step of `workload` on `cluster` (`family`: None for the model's choice)."""
    pace = 1 / cluster.slowest_speed()  # every allreduce waits for the slowest GPU's gradient
    ready, clock = [], workload.forward * pace
    for nbytes, seconds in workload.layers:
        clock += seconds * pace
        if nbytes:  # a layer without parameters has nothing to reduce
            ready.append((clock, nbytes))
    backward_end = clock
    done, free, tick, used = 0, 0.0, 0.0, []
    while done < len(ready):
        tick = max(tick + engine.cycle, free)
        if ready[done][0] > tick:  # nothing new yet: sleep until the cycle after the next gradient
            tick += math.ceil((ready[done][0] - tick) / engine.cycle) * engine.cycle
        buffers, current = [], 0
        while done < len(ready) and ready[done][0] <= tick:
            nbytes = ready[done][1]
            if current and current + nbytes > engine.fusion_bytes:
                buffers.append(current)
                current = 0
            current += nbytes
            done += 1
        buffers.append(current)
        free = tick
        for nbytes in buffers:
            seconds, name = cluster.allreduce(nbytes, family)
            free += seconds
            used.append(name)
    total = max(backward_end, free)
    return Step(total, workload.step / total, total - backward_end, tuple(used))


def scaling(cluster, workload, families=(None, *FAMILIES), scales=SCALES, engine=Engine()):
    """{family (None: the model's choice): [(gpus, Step), ...]} from 2 to 16,384 GPUs."""
    return {family: [(gpus, step(cluster.with_gpus(gpus), workload, family, engine)) for gpus in scales]
            for family in families}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Predict data-parallel scaling on a cluster (ringreduce.planning.simulator).")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--intra-gbytes", type=float, default=150.0, help="GB/s between GPUs of a node")
    parser.add_argument("--intra-latency-us", type=float, default=5.0)
    parser.add_argument("--inter-gbit", type=float, default=100.0, help="Gbit/s of each node's network link")
    parser.add_argument("--inter-latency-us", type=float, default=10.0)
    parser.add_argument("--gradient-mb", type=float, required=True, help="the model's gradients, MB")
    parser.add_argument("--layers", type=int, default=100, help="tensors the gradients come in")
    parser.add_argument("--step-ms", type=float, required=True, help="one GPU's forward and backward, ms")
    parser.add_argument("--fusion-mb", type=float, default=128.0)
    parser.add_argument("--cycle-ms", type=float, default=1.0)
    parser.add_argument("--gpu-spread", type=float, default=GPU_SPREAD * 100,
                        help="fastest to slowest GPU, %% of the median's speed (default: Sinha et al. 2022)")
    parser.add_argument("--compression", choices=("none", "fp16", "bf16"), default="none",
                        help="gradients on the wire in 16 bits (the cast on the GPU is not counted)")
    args = parser.parse_args(argv)
    cluster = Cluster(1, args.gpus_per_node, args.intra_gbytes, args.intra_latency_us * 1e-6, args.inter_gbit,
                      args.inter_latency_us * 1e-6, gpu_spread=args.gpu_spread / 100)
    workload = Workload.even("model", args.gradient_mb * 1e6, args.layers, args.step_ms * 1e-3)
    workload = workload.compressed(0.5 if args.compression != "none" else 1.0)
    engine = Engine(int(args.fusion_mb * (1 << 20)), args.cycle_ms * 1e-3)
    table = scaling(cluster, workload, engine=engine)
    print("GPUs   " + "  ".join(f"{family or 'chosen':>16s}" for family in table) + "  chosen family")
    for index, gpus in enumerate(SCALES):
        chosen = table[None][index][1].families
        print(f"{gpus:6d} " + "  ".join(f"{rows[index][1].efficiency:16.1%}" for rows in table.values())
              + f"  {max(set(chosen), key=chosen.count) if chosen else '-'}")


if __name__ == "__main__":
    main()
