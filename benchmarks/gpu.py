"""The GPU allreduce benchmark: the device transport chosen at init (RINGREDUCE_GPU_TRANSPORT),
with and without FP16 compression, on float32 CuPy arrays from 4 KiB to 1 GiB.

    rrun -np 2 -x RINGREDUCE_GPU_TRANSPORT=staged python benchmarks/gpu.py OUT.json [--max-mib 1024]

Through the engine as a user calls it, `allreduce_(x, op=Sum, compression=...)`, each result
checked against the expected sum before it is timed (median of repeats after a warm-up). Beside
it, the floor of this GPU in the same run: a device-to-device copy of the same size (at 4 and
64 KiB, the engine's own cost per call is the time over that copy's), and the pinned
host<->device copies that staging pays. Where torch has CUDA, torch tensors of float32, float16
and bfloat16 through ringreduce.torch, same sizes (bfloat16 travels as bfloat16 where CuPy 14
can carry it, else as float32). Each row says whether the ranks share one GPU ("2 ranks sharing
one GPU": NCCL refuses that, and staging's numbers are then one GPU's copy engines shared). Rank 0 prints a table and
adds its rows to OUT.json, so that runs under each transport and rank count
(benchmarks/gpu_check.sh) fill one file.
"""

import argparse
import json
import os
import platform
import statistics
import time

import cupy
import numpy as np

import ringreduce as rr
from ringreduce import runtime
from ringreduce.machine import gpu

BUS = lambda n: 2 * (n - 1) / n if n > 1 else 1.0  # noqa: E731  nccl-tests' allreduce bus factor


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--max-mib", type=int, default=1024)
    parser.add_argument("--seconds-per-point", type=float, default=0.3)
    args = parser.parse_args()
    gpu.require_cupy("the GPU benchmark")  # one clear line where there is no GPU
    rr.init()
    rank, size = rr.rank(), rr.size()
    transport = runtime.active().gpu_transport
    gpus = len(set(rr.allgather_object(cupy.cuda.Device().pci_bus_id, name="bench.gpus")))
    placement = "one GPU per rank" if gpus == size else f"{size} ranks sharing {gpus} GPU(s)"
    sizes = [4 << 10, 64 << 10] + [1 << 20 << shift for shift in range(0, 11, 2) if (1 << shift) <= args.max_mib]
    rows = []
    for nbytes in sizes:
        for compression in (rr.Compression.none, rr.Compression.fp16):
            seconds = timed(*cupy_call(nbytes, compression, rank), size, args.seconds_per_point)
            rows.append(row(size, transport, placement, "float32", compression.name, nbytes, seconds))
    for dtype, call in torch_calls(sizes, rank):
        rows.append(row(size, transport, placement, dtype, "none", call[2],
                        timed(*call[:2], size, args.seconds_per_point)))
    floors = [{"ranks": size, "bytes": n, **copy_floor(n)} for n in sizes]
    if rank == 0:
        report(rows, floors, size, args.output)
    rr.shutdown()


def row(size, transport, placement, dtype, compression, nbytes, seconds):
    return {"ranks": size, "transport": transport, "placement": placement, "dtype": dtype,
            "compression": compression, "bytes": nbytes, "seconds": seconds, "algbw_GBps": nbytes / seconds / 1e9,
            "busbw_GBps": nbytes / seconds / 1e9 * BUS(size)}


def cupy_call(nbytes, compression, rank):
    """(refill, allreduce) of `nbytes` of float32 CuPy array, in place, and its sum after it."""
    x = cupy.full(nbytes // 4, rank + 1, dtype=cupy.float32)

    def allreduce():
        rr.allreduce_(x, op=rr.Sum, compression=compression, name="bench")
        return x
    return lambda: x.fill(rank + 1), allreduce


def torch_calls(sizes, rank):
    """(dtype, (refill, allreduce, bytes)) for CUDA torch tensors of float32, float16 and bfloat16
    through ringreduce.torch, at the sizes from 1 MiB up; none without CUDA torch (nor under the
    emulated CuPy, whose GPU torch cannot see: its import alone costs 1.5 s a rank)."""
    if cupy.__version__ == "emulated":
        return []
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    import ringreduce.torch as rrt

    calls = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for nbytes in (n for n in sizes if n >= 1 << 20):
            tensor = torch.full((nbytes // dtype.itemsize,), rank + 1.0, dtype=dtype, device="cuda")

            def allreduce(tensor=tensor):
                rrt.allreduce_(tensor, op=rrt.Sum, name="bench.torch")
                return cupy.asarray(tensor.float())
            calls.append((f"torch {str(dtype).split('.')[-1]}", (lambda t=tensor: t.fill_(rank + 1.0), allreduce,
                                                                 nbytes)))
    return calls


def timed(refill, allreduce, size, seconds_per_point):
    """Median seconds of one call of `allreduce` (its sum checked first), `refill`ed before each:
    in place, the sums grow each call, and fp16 would overflow to inf within 20."""
    refill()
    if not bool(cupy.all(allreduce() == size * (size + 1) / 2)):
        raise AssertionError("an allreduce of the GPU benchmark gave a wrong sum")

    def once():
        refill()
        cupy.cuda.Device().synchronize()  # the refill is not timed
        rr.barrier()
        start = time.perf_counter()
        allreduce()
        return time.perf_counter() - start

    times = [once() for _ in range(3)]
    # How many more fit in the time per point, as rank 0 sees it: every rank must make as many calls.
    more = np.array([min(47, int(seconds_per_point / max(statistics.median(times), 1e-9)))])
    more = int(rr.broadcast(more, root_rank=0, name="bench.repeats")[0])
    times += [once() for _ in range(more)]
    return statistics.median(times)


def copy_floor(nbytes):
    """Seconds of a device-to-device copy and of pinned downloads and uploads of `nbytes`."""
    device = cupy.empty(nbytes, cupy.uint8)
    other = cupy.empty_like(device)
    host = np.frombuffer(cupy.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)

    def median_of(run):
        run()
        cupy.cuda.Device().synchronize()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            run()
            cupy.cuda.Device().synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return {"device_copy_seconds": median_of(lambda: other.__setitem__(Ellipsis, device)),
            "download_seconds": median_of(lambda: device.get(out=host)),
            "upload_seconds": median_of(lambda: device.set(host))}


def report(rows, floors, size, output):
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    machine = (f"{props['name'].decode()}, {cupy.cuda.runtime.getDeviceCount()} GPU(s); "
               f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"GPU allreduce, {size} rank(s), {rows[0]['placement']}, in place; {machine}")
    copies = {floor["bytes"]: floor["device_copy_seconds"] for floor in floors}
    print(f"{'transport':10s} {'dtype':14s} {'fp16':>5s} {'size':>9s} {'time ms':>9s} {'algbw GB/s':>11s} "
          f"{'busbw GB/s':>11s} {'x d2d copy':>11s}")
    for line in rows:
        print(f"{line['transport']:10s} {line['dtype']:14s} {line['compression'] == 'fp16'!s:>5s} "
              f"{readable(line['bytes']):>9s} {line['seconds'] * 1e3:9.3f} {line['algbw_GBps']:11.2f} "
              f"{line['busbw_GBps']:11.2f} {line['seconds'] / copies[line['bytes']]:11.1f}")
    print(f"{'floor':10s} {'size':>9s} {'d2d copy ms':>12s} {'download ms':>12s} {'upload ms':>10s}")
    for floor in floors:
        print(f"{'':10s} {readable(floor['bytes']):>9s} {floor['device_copy_seconds'] * 1e3:12.3f} "
              f"{floor['download_seconds'] * 1e3:12.3f} {floor['upload_seconds'] * 1e3:10.3f}")
    saved = {"machine": machine, "cupy": cupy.__version__, "rows": [], "floors": []}
    if os.path.exists(output):
        with open(output) as f:
            saved = json.load(f)
    nccl = gpu.nccl_module()
    saved.update(machine=machine, cupy=cupy.__version__, nccl=nccl.get_version() if nccl else None)
    saved["rows"] += rows
    saved["floors"] += floors
    with open(output, "w") as f:
        json.dump(saved, f, indent=2)


def readable(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


if __name__ == "__main__":
    main()
