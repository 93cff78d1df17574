"""The cluster simulator (ringreduce.planning.simulator) against Horovod's published scaling: 128 servers
of 4 Pascal GPUs over 25 Gbit/s RoCE, where Horovod reports about 90 % scaling efficiency at
512 GPUs for Inception V3 and ResNet-101 and 68 % for VGG-16 (tf_cnn_benchmarks, batch 64 per
GPU, synthetic data); and, in an earlier README, 90 %, 90 % and 79 % on 32 such servers.

The inputs are fixed here, with their sources in docs/cost_model.md, and one cluster parameter
set serves all three models: nothing is fitted to the published figures. Also writes the
predicted efficiency against GPUs, per algorithm, to docs/images/simulated_scaling.png.

    python benchmarks/horovod_scaling.py
"""

import dataclasses
import pathlib

from ringreduce.planning import simulator

FLOAT32 = 4
# Single P100 (DGX-1), tf_cnn_benchmarks, synthetic data, batch 64: images per second (TensorFlow's
# published benchmarks, May 2017). ResNet-101 is not in that table: its time per image is
# interpolated between ResNet-50 (219) and ResNet-152 (91.8) by multiply-adds (3.8, 7.6, 11.3 G; He
# et al. 2016, table 1).
IMAGES_PER_SECOND = {"Inception V3": 142.0, "VGG-16": 154.0,
                     "ResNet-101": 1 / (1 / 219 + (7.6 - 3.8) / (11.3 - 3.8) * (1 / 91.8 - 1 / 219))}
BATCH = 64
# Horovod's README: at 512 GPUs (128 servers); an earlier version, at 128 GPUs (32 servers) of the same kind.
PUBLISHED = {512: {"Inception V3": 0.90, "ResNet-101": 0.90, "VGG-16": 0.68},
             128: {"Inception V3": 0.90, "ResNet-101": 0.90, "VGG-16": 0.79}}
# The benchmark cluster: 4 GPUs per server on PCIe 3.0 x16 (15.75 GB/s; about 12 GB/s achieved), 25 Gbit/s
# RoCE between servers; latencies of a few microseconds per message as RDMA gives them. Its GPUs differ in
# speed by the simulator's default spread (8 %, Sinha et al. 2022), not by anything measured on it.
HOROVOD_CLUSTER = simulator.Cluster(nodes=128, gpus_per_node=4, intra_gbytes=12.0, intra_latency=5e-6,
                                    inter_gbit=25.0, inter_latency=10e-6)
HOROVOD_ENGINE = simulator.Engine(fusion_bytes=64 << 20, cycle=5e-3)  # HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME
FORWARD_SHARE = 1 / 3  # the backward pass costs about twice the forward


def conv(cin, cout, size, kernel=3, bias=True, batch_norm=False):
    """(parameters, multiply-adds per image) of a convolution producing size x size outputs."""
    params = kernel * kernel * cin * cout + (cout if bias else 0) + (2 * cout if batch_norm else 0)
    return params, kernel * kernel * cin * cout * size * size


def vgg16():
    layers = []
    cin = 3
    for cout, size, count in ((64, 224, 2), (128, 112, 2), (256, 56, 3), (512, 28, 3), (512, 14, 3)):
        for _ in range(count):
            layers.append(conv(cin, cout, size))
            cin = cout
    for fan_in, fan_out in ((25088, 4096), (4096, 4096), (4096, 1000)):
        layers.append((fan_in * fan_out + fan_out, fan_in * fan_out))
    return layers


def resnet101():
    layers = [conv(3, 64, 112, kernel=7, bias=False, batch_norm=True)]
    cin = 64
    for width, size, blocks in ((64, 56, 3), (128, 28, 4), (256, 14, 23), (512, 7, 3)):
        for block in range(blocks):
            layers += [conv(cin, width, size, 1, False, True), conv(width, width, size, 3, False, True),
                       conv(width, 4 * width, size, 1, False, True)]
            if block == 0:
                layers.append(conv(cin, 4 * width, size, 1, False, True))  # the projection shortcut
            cin = 4 * width
    layers.append((2048 * 1000 + 1000, 2048 * 1000))
    return layers


def inception_v3():
    """Its 94 convolutions (with batch norm) taken as equal, 21.8 M parameters and 5.7 G multiply-adds
    between them (Szegedy et al. 2016; 23.8 M in all), and the 2048 x 1000 classifier."""
    convs = [(21.8e6 / 94, 5.7e9 / 94)] * 94
    return [*convs, (2048 * 1000 + 1000, 2048 * 1000)]


def workload(name, layers):
    step = BATCH / IMAGES_PER_SECOND[name]
    total_macs = sum(macs for _, macs in layers)
    backward = step * (1 - FORWARD_SHARE)
    in_backward_order = [(params * FLOAT32, backward * macs / total_macs) for params, macs in reversed(layers)]
    return simulator.Workload(name, step * FORWARD_SHARE, tuple(in_backward_order))


WORKLOADS = {"Inception V3": inception_v3(), "ResNet-101": resnet101(), "VGG-16": vgg16()}


def plot(path, workload_):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = simulator.scaling(HOROVOD_CLUSTER, workload_)
    figure, axes = plt.subplots(figsize=(7, 4))
    for family, rows in table.items():
        axes.plot([gpus for gpus, _ in rows], [100 * s.efficiency for _, s in rows], marker="o" if family else "",
                  linestyle="-" if family else "--", linewidth=3 if family is None else 1.5,
                  label=family or "the model's choice")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("GPUs (4 per server, 25 Gbit/s between servers)")
    axes.set_ylabel("predicted scaling efficiency, %")
    axes.set_title(f"{workload_.name}: predicted efficiency per allreduce algorithm (ringreduce engine)")
    axes.set_ylim(0, 105)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def guide():
    """docs/cluster.md's table: what the knobs do to two models on this kind of cluster."""
    columns = [("flat ring, Horovod's engine", "ring", HOROVOD_ENGINE, 1.0),
               ("flat ring, ringreduce's", "ring", simulator.Engine(), 1.0),
               ("hierarchical", "hierarchical", simulator.Engine(), 1.0), ("auto", None, simulator.Engine(), 1.0),
               ("auto, fp16", None, simulator.Engine(), 0.5),
               ("auto, fusion 32 MiB", None, simulator.Engine(32 << 20, 1e-3), 1.0)]
    print("\n| model, GPUs | " + " | ".join(label for label, *_ in columns) + " |")
    for name in ("ResNet-101", "VGG-16"):
        work = workload(name, WORKLOADS[name])
        for gpus in (512, 4096):
            cluster = HOROVOD_CLUSTER.with_gpus(gpus)
            cells = [simulator.step(cluster, work.compressed(ratio), family, engine).efficiency
                     for _, family, engine, ratio in columns]
            print(f"| {name}, {gpus} | " + " | ".join(f"{cell:.1%}" for cell in cells) + " |")


def main():
    print(f"{'GPUs':>4s} {'model':13s} {'gradients':>10s} {'1-GPU step':>10s} {'predicted':>9s} {'published':>9s}  "
          f"{'exposed comm':>12s}  {'GPUs of one speed':>17s}  the model's choice")
    for gpus, published in sorted(PUBLISHED.items(), reverse=True):
        cluster = HOROVOD_CLUSTER.with_gpus(gpus)
        for name, layers in WORKLOADS.items():
            work = workload(name, layers)
            horovod = simulator.step(cluster, work, "ring", HOROVOD_ENGINE)  # NCCL's ring, as Horovod ran
            one_speed = simulator.step(dataclasses.replace(cluster, gpu_spread=0.0), work, "ring", HOROVOD_ENGINE)
            chosen = simulator.step(cluster, work, None, HOROVOD_ENGINE)
            print(f"{gpus:4d} {name:13s} {work.gradient_bytes / 1e6:8.1f}MB {work.step * 1e3:8.0f}ms "
                  f"{horovod.efficiency:9.1%} {published[name]:9.0%}  {horovod.exposed * 1e3:10.0f}ms  "
                  f"{one_speed.efficiency:17.1%}  {chosen.efficiency:.1%} ({', '.join(sorted(set(chosen.families)))})")
    guide()
    root = pathlib.Path(__file__).resolve().parent.parent
    plot(root / "docs" / "images" / "simulated_scaling.png", workload("ResNet-101", WORKLOADS["ResNet-101"]))


if __name__ == "__main__":
    main()
