"""Which GPU each rank of a host drives and which CPUs go with it (ringreduce/machine/gpu_placement.py),
on node topologies written as data, and rrun's --bind-to gpu on a sysfs tree written in tmp_path."""

import pytest

from ringreduce.launcher import rank
from ringreduce.machine import gpu, gpu_placement


def cpus(low, high):
    return frozenset(range(low, high + 1))


# Two sockets of 16 CPUs, GPUs 0-3 on the first and 4-7 on the second.
TWO_SOCKETS = [cpus(0, 15)] * 4 + [cpus(16, 31)] * 4
# NPS4-style: four NUMA domains of 8 CPUs, two GPUs each, numbered out of the domains' order.
NPS4 = [cpus(8, 15)] * 2 + [cpus(0, 7)] * 2 + [cpus(24, 31)] * 2 + [cpus(16, 23)] * 2
# DGX-style: GPUs 0-1 on the last of four domains of 16 CPUs, 6-7 on the first.
DGX = [cpus(48, 63)] * 2 + [cpus(32, 47)] * 2 + [cpus(16, 31)] * 2 + [cpus(0, 15)] * 2


@pytest.mark.parametrize("gpus, rank_cpus, expected", [
    # --map-by numa --bind-to numa: ranks alternate sockets. Before, rank r took GPU r: rank 1, on
    # the second socket, drove GPU 1 of the first.
    (TWO_SOCKETS, [cpus(0, 15), cpus(16, 31)] * 4, [0, 4, 1, 5, 2, 6, 3, 7]),
    (NPS4, [cpus(0, 7), cpus(8, 15), cpus(16, 23), cpus(24, 31)] * 2, [2, 0, 6, 4, 3, 1, 7, 5]),
    (DGX, [cpus(0, 15), cpus(16, 31), cpus(32, 47), cpus(48, 63)] * 2, [6, 4, 2, 0, 7, 5, 3, 1]),
    # Unbound ranks, or nothing known of the GPUs: local rank r takes GPU r mod count.
    (TWO_SOCKETS, [cpus(0, 31)] * 8, list(range(8))),
    (TWO_SOCKETS[:2], [cpus(0, 31)] * 4, [0, 1, 0, 1]),
    ([None] * 4, [cpus(0, 3), cpus(0, 0), cpus(1, 1), cpus(2, 2)], [0, 1, 2, 3]),
    # More ranks bound to one socket than its GPUs: they share those, not the other socket's.
    (TWO_SOCKETS, [cpus(0, 15)] * 6, [0, 1, 2, 3, 0, 1]),
])
def test_each_rank_drives_a_gpu_near_its_cpus_spread_over_them(gpus, rank_cpus, expected):
    assert gpu_placement.choose_devices(rank_cpus, gpus) == expected


@pytest.mark.parametrize("gpus, local_size, expected", [
    (DGX, 8, {0: (0, cpus(48, 55)), 1: (1, cpus(56, 63)), 2: (2, cpus(32, 39)), 7: (7, cpus(8, 15))}),
    (TWO_SOCKETS, 8, {0: (0, cpus(0, 3)), 3: (3, cpus(12, 15)), 4: (4, cpus(16, 19))}),
    (TWO_SOCKETS[:2], 4, {0: (0, cpus(0, 3)), 1: (1, cpus(4, 7)), 2: (0, cpus(8, 11)), 3: (1, cpus(12, 15))}),
])
def test_bind_to_gpu_splits_each_gpu_s_cpus_among_the_ranks_near_them(gpus, local_size, expected):
    for local_rank, binding in expected.items():
        assert gpu_placement.cpus_for_gpu(local_rank, local_size, gpus, cpus(0, 63)) == binding
    # What init then chooses from those bindings is the GPU each was bound near.
    bound = [gpu_placement.cpus_for_gpu(r, local_size, gpus, cpus(0, 63)) for r in range(local_size)]
    assert gpu_placement.choose_devices([c for _, c in bound], gpus) == [g for g, _ in bound]


def test_bind_to_gpu_keeps_within_the_cpus_the_rank_may_use_and_says_when_it_cannot():
    assert gpu_placement.cpus_for_gpu(0, 2, TWO_SOCKETS[:2], cpus(8, 15)) == (0, cpus(8, 11))
    assert gpu_placement.cpus_for_gpu(0, 1, [None], cpus(0, 3)) is None
    assert gpu_placement.cpus_for_gpu(0, 1, [cpus(16, 31)], cpus(0, 3)) is None  # a cgroup away from the GPU
    assert gpu_placement.cpus_for_gpu(0, 1, [], cpus(0, 3)) is None


def test_init_takes_the_placement_s_gpu_unless_the_user_chose():
    assert gpu.device_for(1, 8, 0, None, [0, 4, 1, 5, 2, 6, 3, 7]) == 4
    assert gpu.device_for(1, 8, 3, None, [0, 4, 1, 5, 2, 6, 3, 7]) is None  # set_device before init
    assert gpu.device_for(1, 8, 0, "5", [0, 4, 1, 5, 2, 6, 3, 7]) is None  # one GPU shown


def write_sysfs(root, devices):
    """PCI devices as sysfs shows them: {bus id: (vendor, class, local_cpulist)}."""
    for bus_id, (vendor, kind, cpulist) in devices.items():
        folder = root / "bus/pci/devices" / bus_id
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "class").write_text(kind + "\n")
        (folder / "local_cpulist").write_text(cpulist + "\n")
    return str(root)


def test_gpus_and_their_cpus_are_read_from_sysfs_in_bus_order(tmp_path):
    sysfs = write_sysfs(tmp_path, {
        "0000:b1:00.0": ("0x10de", "0x030200", "16-31"),
        "0000:3b:00.0": ("0x10de", "0x030200", "0-15"),
        "0000:3c:00.0": ("0x15b3", "0x020700", "0-15"),  # an InfiniBand HCA
        "0000:00:02.0": ("0x10de", "0x030000", "0-7,16-23"),
    })
    assert gpu_placement.nvidia_gpus(sysfs) == ["0000:00:02.0", "0000:3b:00.0", "0000:b1:00.0"]
    assert gpu_placement.local_cpus("0000:3B:00.0", sysfs) == cpus(0, 15)  # CUDA writes bus ids in capitals
    assert gpu_placement.local_cpus("0000:00:02.0", sysfs) == cpus(0, 7) | cpus(16, 23)
    assert gpu_placement.local_cpus("0000:99:00.0", sysfs) is None
    assert gpu_placement.host_gpus(sysfs)[1] == ("0000:3b:00.0", cpus(0, 15))
    buses = gpu_placement.nvidia_gpus(sysfs)
    assert gpu_placement.visible(buses, "2,0") == ["0000:b1:00.0", "0000:00:02.0"]
    assert gpu_placement.visible(buses, "0,7,1") == ["0000:00:02.0"]  # CUDA stops at an index it lacks
    assert gpu_placement.visible(buses, "GPU-8f2a1c3e") is None


def test_the_rank_wrapper_binds_near_its_gpu_and_says_so(tmp_path, monkeypatch):
    sysfs = write_sysfs(tmp_path, {"0000:3b:00.0": ("0x10de", "0x030200", "0-15"),
                                   "0000:b1:00.0": ("0x10de", "0x030200", "16-31")})
    bound = []
    monkeypatch.setattr(rank.os, "sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.setattr(rank.os, "sched_setaffinity", lambda pid, cpus: bound.append(set(cpus)))
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}
    assert rank.bind_to_gpu(env, sysfs) == ", near GPU 1 (0000:b1:00.0)"
    assert bound == [set(range(24, 32))] and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert rank.bind_to_gpu({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "GPU-8f2a"}, sysfs).startswith(
        " (--bind-to gpu: CUDA_VISIBLE_DEVICES names GPUs by UUID")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi either
    assert rank.bind_to_gpu({"LOCAL_RANK": "0"}, str(tmp_path / "none")) == (
        " (--bind-to gpu: no NVIDIA GPU in sysfs or nvidia-smi, so left as mpiexec placed it)")
    assert len(bound) == 1


# `nvidia-smi topo -m` of a two-socket node as the driver prints it: the header underlined with
# terminal escapes, a NIC among the devices, a GPU whose affinity it does not know.
TOPOLOGY = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV12\tSYS\tNODE\t0-15,32-47\t0\t\tN/A\n"
    "GPU1\tNV12\t X \tSYS\tNODE\t0-15,32-47\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tSYS\tN/A\tN/A\t\tN/A\n"
    "NIC0\tNODE\tNODE\tSYS\t X \n\nLegend:\n\n  X    = Self\n"
)


def test_gpus_and_their_cpus_are_read_from_nvidia_smi_where_sysfs_lists_none(tmp_path, monkeypatch):
    """A container that hides the PCI tree: the bus ids and CPU affinity come from nvidia-smi."""
    assert gpu_placement.topology_cpus(TOPOLOGY) == [cpus(0, 15) | cpus(32, 47)] * 2 + [None]
    assert gpu_placement.topology_cpus("No devices were found\n") == []
    assert gpu_placement.normal_bus_id("00000000:3B:00.0") == gpu_placement.normal_bus_id("0000:3b:00.0") \
        == "0000:3b:00.0"
    (tmp_path / "topology").write_text(TOPOLOGY)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f'#!/bin/sh\n[ "$1" = topo ] && exec /bin/cat {tmp_path / "topology"}\n'
                   'printf "00000000:3B:00.0\\n00000000:5E:00.0\\n00000000:B1:00.0\\n"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(smi.parent))
    gpus = gpu_placement.host_gpus(str(tmp_path / "no-sysfs"))
    assert gpus == [("0000:3b:00.0", cpus(0, 15) | cpus(32, 47)), ("0000:5e:00.0", cpus(0, 15) | cpus(32, 47)),
                    ("0000:b1:00.0", None)]
    bound = []
    monkeypatch.setattr(rank.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(rank.os, "sched_setaffinity", lambda pid, cpus: bound.append(set(cpus)))
    assert rank.bind_to_gpu({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "0,1"},
                            str(tmp_path / "no-sysfs")) == ", near GPU 1 (0000:5e:00.0)"
    assert bound == [set(range(32, 48))]  # the second half of the CPUs GPUs 0 and 1 share
