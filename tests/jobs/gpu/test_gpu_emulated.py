"""The GPU path end to end on machines without a GPU: tests/jobs/gpu/gpu.py (every collective on
CuPy arrays) under the real rrun and MPI, with the emulated CuPy of tests/emulated_cupy on the
job's PYTHONPATH (its NCCL is MPI on host memory). Device tagging, the transport choice at init,
the device executor, the NCCL family's calls (ragged blocks padded), MPI on device buffers and the
staging transport (chunks, copies, the host algorithms underneath) run for real; CUDA itself is tested by
test_gpu.py on a GPU."""

import json
import os
import re
import subprocess

import gpu_cases
import numpy as np
import pytest
from elastic_replay import discovery_script

from launch import TESTS, python_of, run_job

EMULATED = os.path.join(TESTS, "support", "emulated_cupy")


def emulated(**variables):
    path = os.pathsep.join(p for p in (EMULATED, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, **variables}


@pytest.mark.parametrize("ranks, variables, transport", [
    (1, {}, "nccl"),
    (2, {}, "nccl"),  # auto: every rank has NCCL and a GPU of its own
    (3, {"RINGREDUCE_GPU_TRANSPORT": "nccl"}, "nccl"),
    # Reductions in rank order: NCCL's float sums go through staging, the rest stays on NCCL.
    (3, {"RINGREDUCE_GPU_TRANSPORT": "nccl", "RINGREDUCE_DETERMINISTIC": "1"}, "nccl"),
    (2, {"EMULATED_CUPY_SHARED_GPU": "1"}, "staged"),  # two ranks on one GPU: NCCL would refuse them
    # The same, as two simulated hosts: the GPU is still one (before, NCCL was chosen and failed there).
    (2, {"EMULATED_CUPY_SHARED_GPU": "1", "RINGREDUCE_SIMULATED_HOSTS": "2"}, "staged"),
    # MPI takes the emulated device arrays (host memory) as buffers; the override says it may.
    (2, {"EMULATED_CUPY_SHARED_GPU": "1", "RINGREDUCE_CUDA_AWARE_MPI": "1"}, "mpi"),
    # Chunks of 1 KiB split the 4 KiB arrays, so the staged allreduce pipelines several.
    (3, {"RINGREDUCE_GPU_TRANSPORT": "staged", "RINGREDUCE_PIPELINE_CHUNK_BYTES": "1024"}, "staged"),
])
def test_every_collective_on_emulated_cupy_arrays(tmp_path, ranks, variables, transport):
    job = run_job(ranks, "gpu/gpu.py", tmp_path, env=emulated(**variables), timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(ranks):
        got = np.load(tmp_path / f"rank{rank}.npz")
        assert str(got["transport"]) == transport
        assert "nccl-bfloat16" in got  # the emulated NCCL says which datatypes it was called with
        gpu_cases.check(got, rank, ranks)


def test_each_rank_makes_a_context_on_its_own_gpu_only(tmp_path):
    """Two GPUs in exclusive-process mode (each takes one process's context): every rank used to
    probe CuPy with a kernel on GPU 0 before init chose its device, so rank 1 failed there and was
    left without a GPU for the job. Now each rank's first kernel runs on its own GPU."""
    claims = tmp_path / "contexts"
    claims.mkdir()
    job = run_job(2, "gpu/gpu.py", tmp_path, env=emulated(EMULATED_CUPY_DEVICES="2",
                                                          EMULATED_CUPY_EXCLUSIVE_DIR=str(claims)), timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    assert sorted(path.name for path in claims.iterdir()) == ["device-0", "device-1"]
    for rank in range(2):
        got = np.load(tmp_path / f"rank{rank}.npz")
        assert str(got["transport"]) == "nccl"
        gpu_cases.check(got, rank, 2)


@pytest.mark.parametrize("visible, warned", [(None, True), ("0", False)])
def test_ranks_sharing_a_gpu_are_warned_about_unless_each_was_shown_its_own(tmp_path, visible, warned):
    """Two ranks and one GPU: said at init. A rank that CUDA_VISIBLE_DEVICES shows one GPU (srun's
    --gpus-per-task gives each its own) was chosen for, and nothing is said."""
    variables = {"EMULATED_CUPY_DEVICES": "1", **({"CUDA_VISIBLE_DEVICES": visible} if visible else {})}
    job = run_job(2, "gpu/gpu.py", tmp_path, env=emulated(**variables), timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    said = "ringreduce: warning: 2 ranks on this host see 1 GPU(s)" in job.stderr
    assert said == warned, job.stderr[-2000:]


def test_numpy_on_one_rank_and_emulated_cupy_on_the_other_is_named_on_both(tmp_path):
    gpu_cases.check_mismatch(run_job(2, "gpu/gpu.py", tmp_path, "mismatch", env=emulated(), timeout=120))


def test_asking_for_nccl_with_two_ranks_on_one_gpu_fails_at_init(tmp_path):
    env = emulated(RINGREDUCE_GPU_TRANSPORT="nccl", EMULATED_CUPY_SHARED_GPU="1")
    job = run_job(2, "gpu/gpu.py", tmp_path, env=env, timeout=120)
    assert job.returncode != 0
    assert "RINGREDUCE_GPU_TRANSPORT=nccl but NCCL is not available on every rank" in job.stderr


@pytest.mark.mpi  # the script starts its ranks through rrun
def test_the_gpu_check_walks_every_step_with_the_emulated_cupy(tmp_path):
    """benchmarks/gpu_check.sh --dry-run, the check a lent GPU machine will run, walked here with the
    emulated CuPy as one shared GPU: every step ends, its GPU tests (the streams job's among them,
    small) pass, and what it measured reaches $OUT, each row saying whether its ranks share a GPU."""
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(["bash", os.path.join(os.path.dirname(TESTS), "benchmarks", "gpu_check.sh"), "--dry-run"],
                          env=dict(os.environ, OUT=str(out)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    (result,) = out.glob("gpu-*.json")
    rows = json.loads(result.read_text())["rows"]
    # NCCL refuses two ranks on one GPU; every other transport ran at 1 and 2 ranks.
    assert {(row["ranks"], row["transport"]) for row in rows} == {(1, "nccl"), (1, "mpi"), (1, "staged"),
                                                                   (2, "mpi"), (2, "staged")}
    assert {row["placement"] for row in rows if row["ranks"] == 2} == {"2 ranks sharing 1 GPU(s)"}
    assert {row["bytes"] for row in rows} == {4 << 10, 64 << 10, 1 << 20}
    tests = re.search(r"^(\d+) passed(, \d+ (skipped|deselected))* in ", done.stdout, re.MULTILINE)
    assert tests and "failed" not in done.stdout.split("== GPU tests")[1].split("==")[0], done.stdout[-3000:]


def test_process_sets_take_the_gpu_in_turn(tmp_path):
    """Every process set of 3 ranks (the global one and each pair) allreduces on the GPU through
    NCCL at once, even ranks starting their sets first to last and odd ranks last to first; the
    emulated NCCL runs one kernel at a time on a GPU, NCCL's worst case. Each set's engine used to
    start its collective as soon as its ranks agreed, in no order the ranks shared, and two ranks'
    kernels waited for each other (a hang by the third step). Now a set's device collectives run
    only in a cycle where every member holds its GPU's turn: all 40 steps end, each sum exact."""
    steps = 40
    job = run_job(3, "gpu/sets_on_one_gpu.py", tmp_path, steps, env=emulated(EMULATED_CUPY_DEVICES="3"), timeout=60)
    assert job.returncode == 0, job.stderr[-3000:]
    members = [[0, 1, 2], [0, 1], [1, 2], [0, 2]]
    for rank in range(3):
        expected = np.array([[sum(r + 1 + step + 10 * index for r in ranks) if rank in ranks else 0
                              for index, ranks in enumerate(members)] for step in range(steps)], np.float32)
        np.testing.assert_array_equal(np.load(tmp_path / f"rank{rank}.npy"), expected)


def test_a_peer_that_dies_inside_nccl_is_aborted_and_the_survivors_go_on_in_place(tmp_path):
    """Open MPI with ULFM, an elastic job: world rank 2 of 3 dies inside its NCCL allreduce of
    step 5, and NCCL's kernels on the survivors wait for it for ever (the emulated NCCL's too).
    The wait used to block in the stream's synchronize, where rrun's word of the failure could not
    reach it: the survivors hung. Now the wait watches for a failed rank and aborts the NCCL
    communicator, and the survivors go on at 2 ranks from the commit of step 4, through a new one."""
    script, _ = discovery_script(tmp_path, ["localhost:3"])
    job = run_job(3, "gpu/nccl_peer_dies.py", 10, python=python_of("openmpi"),
                  env=emulated(EMULATED_CUPY_DEVICES="3", EMULATED_NCCL_DIE="2:6"),
                  rrun_args=("--min-np", "2", "--host-discovery-script", script), timeout=60)
    assert job.returncode == 0, job.stderr[-3000:]
    said = sorted((json.loads(text) for rank in (0, 1) for text in job.lines_of(rank)), key=lambda s: s["rank"])
    assert said == [{"rank": rank, "size": 2, "sums": [6.0] * 5 + [3.0] * 5, "transport": "nccl"}
                    for rank in (0, 1)], job.stdout[-2000:]
    assert "rrun: resumed from commit 5 on 2 ranks in place" in job.stderr, job.stderr[-2000:]
