"""Work the caller queued and did not wait for, through the collectives: what only a real GPU, whose
kernels run after the call that queued them returns, can show.

- An input made by a long kernel chain on a side CuPy stream, allreduced and alltoall'ed (plain
  and async) from inside that stream (ringreduce's ready event is recorded there: the engine,
  whose own thread reads the async alltoall's input, must wait for it).
- A result read by a long kernel chain on the caller's stream and freed at once, before the next
  collective, whose result may take the same memory (it must not be written while still read).
- A CUDA torch tensor made by a long chain on a side torch stream (DLPack makes CuPy wait for it).
Each is checked exactly: the chains multiply by the identity (exact in float32, TF32 off).
Usage: streams.py [SIDE]   (the blocks' side, 1024 by default; the emulated CuPy runs it small)"""

import os
import sys

import cupy
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import gpu_cases  # noqa: E402

import ringreduce as rr  # noqa: E402

rr.init()
rank, size = rr.rank(), rr.size()
SIDE = int(sys.argv[1]) if len(sys.argv) > 1 else 1024  # 1024: each product is ~0.1 ms of GPU work
LINKS = 40
identity = cupy.eye(SIDE, dtype=cupy.float32)
total = size * (size + 1) / 2


def long_chain(array):
    """`array` again, after LINKS products with the identity queued on the current stream."""
    for _ in range(LINKS):
        array = cupy.matmul(array, identity)
    return array


def expect(name, got, value):
    got = cupy.asnumpy(got)
    if not np.array_equal(got, np.full(got.shape, value, got.dtype)):
        raise AssertionError(f"rank {rank}: {name}: expected {value} everywhere, got {got.ravel()[:4]} ...")


side = cupy.cuda.Stream(non_blocking=True)
with side:
    made = long_chain(cupy.full((SIDE, SIDE), rank + 1.0, dtype=cupy.float32))
    summed = rr.allreduce(made, op=rr.Sum, name="side.allreduce")
    rows = long_chain(cupy.full((SIDE, SIDE), float(rank), dtype=cupy.float32))
    exchanged = rr.alltoall(rows, name="side.alltoall")
    later = long_chain(cupy.full((SIDE, SIDE), float(rank), dtype=cupy.float32))
    handle = rr.alltoall_async(later, name="side.alltoall_async")  # read by the engine's thread
exchanged_async = rr.synchronize(handle)
side.synchronize()
expect("allreduce of a side stream's input", summed, total)
part = SIDE // size
for source in range(size):
    for name, result in (("alltoall", exchanged), ("alltoall_async", exchanged_async)):
        expect(f"{name} block from rank {source}", result[source * part:(source + 1) * part], float(source))

readers = []
for step in range(4):
    result = rr.allreduce(cupy.full((SIDE, SIDE), rank + 1.0 + step, dtype=cupy.float32), op=rr.Sum,
                          name=f"reuse.{step}")
    readers.append((step, long_chain(result)))  # queued; `result` is freed at the next assignment
    del result
cupy.cuda.Device().synchronize()
for step, read in readers:
    expect(f"a result read while the next collective ran (step {step})", read, total + size * step)

torch = gpu_cases.cuda_torch()
if torch is not None:
    import ringreduce.torch as rrt

    torch.backends.cuda.matmul.allow_tf32 = False
    stream = torch.cuda.Stream()
    eye = torch.eye(SIDE, device="cuda")
    with torch.cuda.stream(stream):
        tensor = torch.full((SIDE, SIDE), rank + 1.0, device="cuda")
        for _ in range(LINKS):
            tensor = tensor @ eye
        reduced = rrt.allreduce(tensor, op=rrt.Sum, name="torch.side")
    stream.synchronize()
    expect("allreduce of a side torch stream's tensor", cupy.asarray(reduced.cpu().numpy()), total)
print(f"rank {rank}: every stream case exact", flush=True)
rr.shutdown()
