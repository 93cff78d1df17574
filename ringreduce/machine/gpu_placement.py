"""Which GPU each rank of a host drives, and which CPUs go with it: read from where the GPUs sit
(the CPUs sysfs lists as local to each GPU's PCI device, or the CPU affinity `nvidia-smi topo -m`
prints where the PCI tree is hidden), not from the local rank alone. A rank bound to socket 1 that
drives a GPU of socket 0 crosses the socket link for every copy.

Standard library only: rrun's per-rank wrapper binds ranks with it before MPI or CuPy load.
"""

import glob
import os
import re
import shutil
import subprocess

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA controller, 3D controller


def parse_cpulist(text: str) -> frozenset[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus)


def local_cpus(bus_id: str, sysfs: str = "/sys") -> frozenset[int] | None:
    """The CPUs the kernel lists as local to PCI device `bus_id` (0000:3b:00.0), or None unknown."""
    try:
        with open(os.path.join(sysfs, "bus/pci/devices", bus_id.lower(), "local_cpulist")) as listed:
            return parse_cpulist(listed.read()) or None
    except (OSError, ValueError):
        return None


def nvidia_gpus(sysfs: str = "/sys") -> list[str]:
    """The PCI bus ids of this host's NVIDIA GPUs, in bus order (CUDA's order under
    CUDA_DEVICE_ORDER=PCI_BUS_ID, and nvidia-smi's)."""
    found = []
    for device in sorted(glob.glob(os.path.join(sysfs, "bus/pci/devices/*"))):
        try:
            with open(os.path.join(device, "vendor")) as vendor, open(os.path.join(device, "class")) as kind:
                if vendor.read().strip() == NVIDIA_VENDOR and kind.read().strip().startswith(GPU_CLASSES):
                    found.append(os.path.basename(device))
        except OSError:
            continue
    return found


def normal_bus_id(bus_id: str) -> str:
    """One spelling of a PCI address: CUDA's 0000:3B:00.0, nvidia-smi's 00000000:3B:00.0 and
    sysfs's 0000:3b:00.0 are all 0000:3b:00.0."""
    domain, _, rest = bus_id.strip().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest.lower()}"
    except ValueError:
        return bus_id.strip().lower()


def topology_cpus(topology: str) -> list[frozenset[int] | None]:
    """Each GPU's local CPUs, in nvidia-smi's GPU order, from the "CPU Affinity" column of
    `nvidia-smi topo -m` (tab-separated; its header may be underlined with terminal escapes);
    None for a GPU it gives none (N/A)."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", topology).splitlines()
    header = next(([cell.strip() for cell in line.split("\t")] for line in lines if "CPU Affinity" in line), None)
    if header is None:
        return []
    column = header.index("CPU Affinity")
    near: list[frozenset[int] | None] = []
    for cells in (line.split("\t") for line in lines):
        if re.fullmatch(r"GPU\d+", cells[0].strip()):
            try:
                near.append(parse_cpulist(cells[column]) or None if len(cells) > column else None)
            except ValueError:
                near.append(None)
    return near


def smi_gpus() -> list[tuple[str, frozenset[int] | None]]:
    """(bus id, local CPUs) of each GPU nvidia-smi lists, in its order; [] without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        buses = subprocess.run([smi, "--query-gpu=pci.bus_id", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=60, check=True).stdout.split()
        near = topology_cpus(subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=60).stdout)
    except (OSError, subprocess.SubprocessError):
        return []
    return [(normal_bus_id(bus), near[index] if index < len(near) else None) for index, bus in enumerate(buses)]


def host_gpus(sysfs: str = "/sys") -> list[tuple[str, frozenset[int] | None]]:
    """This host's NVIDIA GPUs in PCI order, each as (bus id, the CPUs near it): from sysfs where
    its PCI tree lists them (no process to start), else from nvidia-smi (a container that hides
    the tree)."""
    buses = nvidia_gpus(sysfs)
    return [(bus, local_cpus(bus, sysfs)) for bus in buses] if buses else smi_gpus()


def visible(gpus: list, cuda_visible_devices: str | None) -> list | None:
    """The GPUs CUDA shows this process, in its order, picked from `gpus` (the host's, in PCI
    order) by CUDA_VISIBLE_DEVICES given as indexes; None where it names them otherwise (UUIDs,
    MIG instances), which cannot be mapped."""
    if cuda_visible_devices is None:
        return gpus
    shown = []
    for item in cuda_visible_devices.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit():
            return None
        if int(item) >= len(gpus):
            break  # CUDA stops at the first index it does not have
        shown.append(gpus[int(item)])
    return shown


def choose_devices(rank_cpus: list[frozenset[int]], gpu_cpus: list[frozenset[int] | None]) -> list[int]:
    """Each rank's GPU (the ranks of one host, in local rank order): among the GPUs whose local
    CPUs hold most of the rank's own, the one fewest ranks drive so far (the first on a tie). Where
    nothing is known of the GPUs' CPUs, or a rank may run anywhere, that is local rank r on GPU
    r mod count; ranks bound near a GPU get that GPU, spread over the GPUs of their domain."""
    if not gpu_cpus:
        return []
    drivers = [0] * len(gpu_cpus)
    chosen = []
    for cpus in rank_cpus:
        overlap = [len(cpus & near) if near is not None else 0 for near in gpu_cpus]
        best = max(overlap)
        candidates = [gpu for gpu, shared in enumerate(overlap) if shared == best]
        gpu = min(candidates, key=lambda g: (drivers[g], g))
        drivers[gpu] += 1
        chosen.append(gpu)
    return chosen


def cpus_for_gpu(local_rank: int, local_size: int, gpu_cpus: list[frozenset[int] | None],
                 allowed: frozenset[int]) -> tuple[int, frozenset[int]] | None:
    """`--bind-to gpu`: (the GPU local rank r of `local_size` drives, the CPUs it is bound to). Rank
    r takes GPU r mod count; the CPUs near that GPU (within `allowed`) are split evenly among the
    host's ranks whose GPUs have the same CPUs, in local rank order. None where they are unknown."""
    if not gpu_cpus:
        return None
    gpu = local_rank % len(gpu_cpus)
    near = gpu_cpus[gpu]
    if near is None or not near & allowed:
        return None
    sharing = [r for r in range(max(local_size, local_rank + 1)) if gpu_cpus[r % len(gpu_cpus)] == near]
    ordered = sorted(near & allowed)
    share, index = max(1, len(ordered) // len(sharing)), sharing.index(local_rank)
    start = (index * share) % len(ordered)  # more ranks than CPUs: they share in turn
    return gpu, frozenset(ordered[start:start + share])
