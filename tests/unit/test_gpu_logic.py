"""The GPU path's pure logic, on machines without a GPU: which device a rank takes, which
transport the ranks agree on, and the staging transport's chunks, copies and results, with a
host stand-in for the few CUDA calls it makes. The GPU itself is tested in tests/jobs/gpu/test_gpu.py."""

import subprocess
import sys

import numpy as np
import pytest
from device_standins import HostStandIn, LoggedRing
from threads import data, run_ranks

from ringreduce.algorithms.device import Staged
from ringreduce.machine import gpu
from ringreduce.machine.layout import even_counts, offsets_of
from ringreduce.ops import ReduceOp


@pytest.mark.parametrize("local_rank, count, current, visible, expected", [
    (0, 4, 0, None, 0),
    (3, 4, 0, None, 3),
    (5, 4, 0, None, 1),  # more ranks than GPUs: they share in turn
    (1, 2, 1, None, None),  # the user called set_device before init
    (2, 1, 0, "3", None),  # CUDA_VISIBLE_DEVICES gives this rank its one GPU
    (1, 2, 0, "0,1", 1),
    (0, 0, 0, None, None),  # no GPU
])
def test_each_local_rank_takes_its_own_gpu_unless_the_user_chose(local_rank, count, current, visible, expected):
    assert gpu.device_for(local_rank, count, current, visible) == expected


def test_transport_choice_prefers_nccl_then_cuda_aware_mpi_then_staging():
    both = gpu.NCCL | gpu.CUDA_AWARE_MPI
    assert gpu.choose_transport("auto", both) == "nccl"
    assert gpu.choose_transport("auto", gpu.CUDA_AWARE_MPI) == "mpi"
    assert gpu.choose_transport("auto", 0) == "staged"
    assert gpu.choose_transport("staged", both) == "staged"
    assert gpu.choose_transport("mpi", gpu.CUDA_AWARE_MPI) == "mpi"


def test_a_transport_asked_for_but_missing_on_some_rank_is_an_error():
    with pytest.raises(gpu.GpuError, match="RINGREDUCE_GPU_TRANSPORT=nccl but NCCL is not available on every rank"):
        gpu.choose_transport("nccl", gpu.CUDA_AWARE_MPI)
    with pytest.raises(gpu.GpuError, match="CUDA-aware MPI is not available"):
        gpu.choose_transport("mpi", gpu.NCCL)


def test_without_cupy_a_gpu_request_says_why(monkeypatch):
    gpu._load.cache_clear()
    gpu._usable.cache_clear()
    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda name: None)
    try:
        assert gpu.cupy_or_none() is None
        with pytest.raises(gpu.GpuError, match=r"a CUDA tensor needs a working CuPy and GPU: CuPy is not "
                                               r"installed \(pip install ringreduce\[gpu\]\)"):
            gpu.require_cupy("a CUDA tensor")
    finally:
        gpu._load.cache_clear()
        gpu._usable.cache_clear()


def test_cuda_aware_mpi_is_asked_of_the_library_and_can_be_forced(monkeypatch):
    monkeypatch.delenv("RINGREDUCE_CUDA_AWARE_MPI", raising=False)
    assert gpu.mpi_takes_device_buffers() is False  # the MPI of the test setup is built without CUDA
    monkeypatch.setenv("RINGREDUCE_CUDA_AWARE_MPI", "1")
    assert gpu.mpi_takes_device_buffers() is True


def test_the_gpu_report_runs_without_a_gpu():
    done = subprocess.run([sys.executable, "-m", "ringreduce.machine.gpu"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    if gpu.cupy_or_none() is None:
        assert done.stdout.startswith("    [ ] GPU arrays: CuPy ")
    else:
        assert "staging through pinned host memory" in done.stdout


def staged(transport, chunk_bytes, log=None):
    log = [] if log is None else log
    return Staged(HostStandIn(log), LoggedRing(transport, log), transport.rank, chunk_bytes)


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("chunk_bytes", [8, 24, 1 << 20])
def test_staged_allreduce_in_chunks(size, chunk_bytes):
    """Chunks of 1 and 3 int64 elements and one whole: every download is queued before the first
    chunk's collective (the overlap), and each chunk goes back up right after its collective."""
    for length in (0, 1, 7, 50):
        def work(transport, length=length):
            log = []
            buf = data(transport.rank, length)
            staged(transport, chunk_bytes, log).allreduce(buf, ReduceOp.SUM)
            return buf, log

        expected = np.sum([data(r, length) for r in range(size)], axis=0, dtype=np.int64)
        chunk = chunk_bytes // 8
        chunks = [min(chunk, length - start) for start in range(0, length, chunk)]
        for got, log in run_ranks(size, work):
            np.testing.assert_array_equal(got, expected)
            downloads = [n for kind, n in log if kind == "download"]
            assert downloads == chunks
            assert log[:len(chunks)] == [("download", n) for n in chunks]
            assert log[len(chunks):] == [entry for n in chunks for entry in (("allreduce", n), ("upload", n))]


@pytest.mark.parametrize("size", [1, 2, 3])
def test_staged_allreduce_reads_a_separate_source(size):
    def work(transport):
        buf = np.zeros(9, np.int64)
        staged(transport, 16).allreduce(buf, ReduceOp.SUM, data(transport.rank, 9))
        return buf

    expected = np.sum([data(r, 9) for r in range(size)], axis=0)
    for got in run_ranks(size, work):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_staged_reducescatter_allgather_and_broadcast(size):
    counts = even_counts(7, size)
    offsets = offsets_of(counts)
    ragged = offsets_of([r + 1 for r in range(size)])

    def work(transport):
        rank = transport.rank
        family = staged(transport, 16)
        mine = family.reducescatter(data(rank, 7), offsets, ReduceOp.SUM).copy()
        gathered = np.zeros(ragged[-1], np.int64)
        gathered[ragged[rank]:ragged[rank + 1]] = data(rank, rank + 1)
        family.allgather(gathered, ragged)
        broadcasts = []
        for root in range(size):
            buf = data(rank, 5)
            family.broadcast(buf, root)
            broadcasts.append(buf)
        return mine, gathered, broadcasts

    total = np.sum([data(r, 7) for r in range(size)], axis=0)
    for rank, (mine, gathered, broadcasts) in enumerate(run_ranks(size, work)):
        np.testing.assert_array_equal(mine, total[offsets[rank]:offsets[rank + 1]])
        np.testing.assert_array_equal(gathered, np.concatenate([data(r, r + 1) for r in range(size)]))
        for root, got in enumerate(broadcasts):
            np.testing.assert_array_equal(got, data(root, 5))


def test_a_cpu_job_never_imports_cupy():
    """No NVIDIA device here: init must not pay for importing CuPy (installed or not)."""
    if gpu.glob.glob("/dev/nvidia[0-9]*"):
        pytest.skip("this machine has an NVIDIA device")
    code = ("import sys, numpy, ringreduce as rr; rr.init(); rr.allreduce(numpy.ones(3)); "
            "print('cupy' in sys.modules); rr.shutdown()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_bfloat16_travels_only_where_the_gpu_runs_its_kernel():
    """numpy bfloat16 arrays are refused (the host path's narrow-float arithmetic is slow); a
    CuPy that cannot run the cast-and-scale kernel on bfloat16 (CuPy 13 has no such dtype) says
    why, asked once."""
    from ml_dtypes import bfloat16

    from ringreduce.errors import UnsupportedDtypeError
    from ringreduce.numerics import arrays, device_kernels

    with pytest.raises(UnsupportedDtypeError, match="bfloat16 travels only as GPU"):
        arrays.check_dtype(np.ones(2, bfloat16))

    class OldCupy:
        calls = 0

        @classmethod
        def full(cls, shape, value, dtype):
            cls.calls += 1
            raise TypeError("dtype 'bfloat16' is not supported")

    assert device_kernels.bfloat16_unavailable(OldCupy) == "TypeError: dtype 'bfloat16' is not supported"
    assert device_kernels.bfloat16_unavailable(OldCupy) is not None and OldCupy.calls == 1
