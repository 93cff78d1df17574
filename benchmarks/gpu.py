"""The GPU allreduce benchmark: the device transport chosen at init (RINGREDUCE_GPU_TRANSPORT),
with and without FP16 compression, on float32 CuPy arrays from 1 MiB to 1 GiB.

    rrun -np 2 -x RINGREDUCE_GPU_TRANSPORT=staged python benchmarks/gpu.py OUT.json [--max-mib 1024]

Through the engine as a user calls it, `allreduce_(x, op=Sum, compression=...)`, each result
checked against the expected sum before it is timed (median of repeats after a warm-up). Beside
it, the floor of this GPU in the same run: a device-to-device copy of the same size, and the
pinned host<->device copies that staging pays. Rank 0 prints a table and adds its rows to
OUT.json, so that runs under each transport and rank count (benchmarks/gpu_check.sh) fill one file.
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
    sizes = [1 << 20 << shift for shift in range(0, 11, 2) if (1 << shift) <= args.max_mib]
    rows = []
    for nbytes in sizes:
        for compression in (rr.Compression.none, rr.Compression.fp16):
            seconds = timed(nbytes, compression, rank, size, args.seconds_per_point)
            rows.append({"ranks": size, "transport": transport, "compression": compression.name, "bytes": nbytes,
                         "seconds": seconds, "algbw_GBps": nbytes / seconds / 1e9,
                         "busbw_GBps": nbytes / seconds / 1e9 * BUS(size)})
    floors = [{"ranks": size, "bytes": n, **copy_floor(n)} for n in sizes]
    if rank == 0:
        report(rows, floors, size, args.output)
    rr.shutdown()


def timed(nbytes, compression, rank, size, seconds_per_point):
    """Median seconds of one in-place allreduce of `nbytes` of float32 (checked first)."""
    count = nbytes // 4
    x = cupy.full(count, rank + 1, dtype=cupy.float32)
    rr.allreduce_(x, op=rr.Sum, compression=compression, name="bench")
    expected = size * (size + 1) / 2
    if not bool(cupy.all(x == expected)):
        raise AssertionError(f"{compression.name} allreduce of {nbytes} bytes gave a wrong sum")

    def once():
        x.fill(rank + 1)  # in place, the sums grow each call: fp16 would overflow to inf within 20
        cupy.cuda.Device().synchronize()  # the refill is not timed
        rr.barrier()
        start = time.perf_counter()
        rr.allreduce_(x, op=rr.Sum, compression=compression, name="bench")
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
    print(f"GPU allreduce, {size} rank(s), float32, in place; {machine}")
    print(f"{'transport':10s} {'fp16':>5s} {'size':>9s} {'time ms':>9s} {'algbw GB/s':>11s} {'busbw GB/s':>11s}")
    for row in rows:
        print(f"{row['transport']:10s} {row['compression'] == 'fp16'!s:>5s} {row['bytes'] >> 20:>5d} MiB "
              f"{row['seconds'] * 1e3:9.3f} {row['algbw_GBps']:11.2f} {row['busbw_GBps']:11.2f}")
    print(f"{'floor':10s} {'size':>9s} {'d2d copy ms':>12s} {'download ms':>12s} {'upload ms':>10s}")
    for floor in floors:
        print(f"{'':10s} {floor['bytes'] >> 20:>5d} MiB {floor['device_copy_seconds'] * 1e3:12.3f} "
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


if __name__ == "__main__":
    main()
