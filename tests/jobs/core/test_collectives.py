"""Every collective, op and dtype through the real rrun and MPI at 1 to 4 ranks (and with
MPI's own collectives and with tiny pipeline pieces), compared with numpy references."""

import json

import numpy as np
import pytest

import cases
from launch import cluster_missing, python_of, require_cluster, run_job

# (name, ranks, environment, MPI, algorithms): the default choice at every size, then each
# algorithm family forced, in small pieces, across simulated hosts, and under Open MPI.
SMALL_PIECES = {"RINGREDUCE_SHM_PIECE_BYTES": "12345", "RINGREDUCE_PIPELINE_CHUNK_BYTES": "4096"}
# The families whose latency grows with log2 of the ranks, at every rank count from 1 to 8: one job
# per rank count runs every case under each (ringreduce started again for each), every call through
# the engine and as a collective of its own (no fusion), the allreduce cases submitted together so
# that 8 ranks on 2 cores negotiate them at once (the 10M-element case takes the pipelined paths;
# tests/unit/test_algorithms.py has every piece size on threads).
LOG_FAMILIES = ("halving_doubling", "tree")
LOG_ENV = {"RINGREDUCE_PROGRAM_ORDER": "0", "RINGREDUCE_FUSION_THRESHOLD": "0", "COLLECTIVES_TOGETHER": "1"}
CONFIGS = [
    ("auto-1", 1, {}, "mpich", ()),
    ("auto-2", 2, {}, "mpich", ()),
    ("auto-3", 3, {}, "mpich", ()),
    ("auto-4", 4, {}, "mpich", ()),
    ("ring-3", 3, {"RINGREDUCE_ALGORITHM": "ring"}, "mpich", ()),
    ("ring-pieces-3", 3, {"RINGREDUCE_ALGORITHM": "ring", **SMALL_PIECES}, "mpich", ()),
    ("shm-pieces-3", 3, {"RINGREDUCE_ALGORITHM": "shm", **SMALL_PIECES}, "mpich", ()),
    ("mpi-3", 3, {"RINGREDUCE_ALGORITHM": "mpi"}, "mpich", ()),
    # Two hosts of two ranks: the hierarchical allreduce (in small pieces: at every size).
    ("hierarchical-4", 4, {"RINGREDUCE_SIMULATED_HOSTS": "2", "RINGREDUCE_ALGORITHM": "shm", **SMALL_PIECES},
     "mpich", ()),
    # Hosts of 2 and 1 ranks: no hierarchical allreduce, the flat ring across hosts.
    ("uneven-hosts-3", 3, {"RINGREDUCE_SIMULATED_HOSTS": "2"}, "mpich", ()),
    *[(f"log-{n}", n, LOG_ENV, "mpich", LOG_FAMILIES) for n in range(1, 9)],
    ("openmpi-3", 3, {}, "openmpi", ()),
    ("openmpi-mpi-2", 2, {"RINGREDUCE_ALGORITHM": "mpi"}, "openmpi", ()),
    # Two real hosts (network namespaces with their own sshd, tests/cluster/up.sh), over the veth.
    ("two-hosts-4", 4, {}, "cluster", ()),
    ("two-hosts-openmpi-4", 4, {}, "cluster-openmpi", ()),
]
CLUSTER_ARGS = ("-H", "hosta:2,hostb:2", "--network-interface", "rrnet0")
# One fixture instance per configuration and algorithm; a job's algorithms share its run.
RUNS = [(config, algorithm) for config in CONFIGS for algorithm in (config[4] or (None,))]


@pytest.fixture(scope="module")
def finished_jobs():
    return {}


@pytest.fixture(scope="module", params=RUNS, ids=[c[0] + (f"-{a}" if a else "") for c, a in RUNS])
def job(request, tmp_path_factory, finished_jobs):
    """One run of the worker (or its results under one of the algorithms it ran); the tests below
    read them."""
    (name, size, env, mpi, algorithms), algorithm = request.param
    if name not in finished_jobs:
        on_cluster = mpi.startswith("cluster")
        if on_cluster and cluster_missing():
            require_cluster(cluster_missing())
        python = python_of({"cluster": "mpich", "cluster-openmpi": "openmpi"}.get(mpi, mpi))
        out = tmp_path_factory.mktemp(name)
        result = run_job(size, "core/collectives.py", out, *algorithms, env=env, python=python, timeout=100,
                         rrun_args=CLUSTER_ARGS if on_cluster else (), on_cluster=on_cluster)
        assert result.returncode == 0, result.stderr[-3000:]
        finished_jobs[name] = out
    out = finished_jobs[name] / algorithm if algorithm else finished_jobs[name]
    ranks = [dict(np.load(out / f"rank{r}.npz")) for r in range(size)]
    objects = [json.loads((out / f"rank{r}.json").read_text()) for r in range(size)]
    return size, ranks, objects


def assert_same_everywhere(ranks, key, expected):
    for rank, results in enumerate(ranks):
        got = results[key]
        assert got.dtype == expected.dtype, (key, rank)
        assert got.shape == expected.shape, (key, rank)
        np.testing.assert_array_equal(got, expected, err_msg=f"{key} on rank {rank}")


def test_allreduce_every_dtype_op_and_length(job):
    size, ranks, _ = job
    checked = 0
    for key, dtype, op, length in cases.allreduce_cases(size):
        inputs = [cases.case_input(r, dtype, op, length) for r in range(size)]
        assert_same_everywhere(ranks, key, cases.reference_reduce(inputs, op))
        checked += 1
    assert checked == sum(1 for _ in cases.allreduce_cases(size))


def test_allreduce_random_floats_close_to_numpy(job):
    size, ranks, _ = job
    for dtype in ("float32", "float64"):
        inputs = [cases.normal(r, dtype, 999) for r in range(size)]
        expected = np.sum(np.stack(inputs).astype(np.float64), axis=0)
        tolerance = 1e-5 if dtype == "float32" else 1e-12
        for results in ranks:
            np.testing.assert_allclose(results[f"allreduce-random-{dtype}"], expected, rtol=tolerance,
                                       atol=tolerance)
        # Every rank holds the very same bits, whatever the order of reduction.
        for results in ranks[1:]:
            np.testing.assert_array_equal(results[f"allreduce-random-{dtype}"],
                                          ranks[0][f"allreduce-random-{dtype}"])


def test_allreduce_ten_million_elements(job):
    size, ranks, _ = job
    expected = cases.reference_reduce([cases.values(r, "float32", 10_000_000) for r in range(size)], "Sum")
    assert_same_everywhere(ranks, "allreduce-10M", expected)


def test_allreduce_keeps_shape_scalars_scaling_and_odd_inputs(job):
    size, ranks, _ = job
    shaped = [cases.values(r, "float64", 60).reshape(3, 4, 5) for r in range(size)]
    assert_same_everywhere(ranks, "allreduce-shape", cases.reference_reduce(shaped, "Sum"))
    assert_same_everywhere(ranks, "allreduce-scalar", np.array(size * (size + 1) / 2))
    floats = [cases.values(r, "float64", 101) for r in range(size)]
    assert_same_everywhere(ranks, "allreduce-scaled-float64", np.sum([x * 0.5 for x in floats], axis=0) * 3.0)
    ints = [np.trunc(cases.values(r, "int32", 101) * 0.5).astype(np.int32) for r in range(size)]
    expected_ints = np.trunc(np.sum(ints, axis=0, dtype=np.int32) * 3.0).astype(np.int32)
    assert_same_everywhere(ranks, "allreduce-scaled-int32", expected_ints)
    strided = [cases.values(r, "float32", 40)[::2] for r in range(size)]
    assert_same_everywhere(ranks, "allreduce-noncontiguous", cases.reference_reduce(strided, "Sum"))
    readonly = [cases.values(r, "int16", 33) for r in range(size)]
    assert_same_everywhere(ranks, "allreduce-readonly", cases.reference_reduce(readonly, "Max"))
    in_place = [cases.values(r, "int64", 77) for r in range(size)]
    assert_same_everywhere(ranks, "allreduce_-inplace", cases.reference_reduce(in_place, "Sum"))


def test_allreduce_of_a_fused_group_mostly_in_place(job):
    """Averaged together as one fused group (on shared memory: each result written where its
    array lies), on every algorithm and topology of the configurations."""
    size, ranks, _ = job
    for index in range(len(cases.FUSED_LENGTHS)):
        inputs = [cases.fused_input(r, index) for r in range(size)]
        assert_same_everywhere(ranks, f"fused-{index}", cases.reference_reduce(inputs, "Average"))


def test_allgather_ragged_first_dimension(job):
    size, ranks, _ = job
    for dtype in cases.DTYPES:
        parts = [cases.values(r, dtype, 3 * (r + 1)).reshape(r + 1, 3) for r in range(size)]
        assert_same_everywhere(ranks, f"allgather-{dtype}", np.concatenate(parts))
    parts = [cases.values(r, "int32", 2 * r).reshape(r, 2) for r in range(size)]
    assert_same_everywhere(ranks, "allgather-empty-on-rank0", np.concatenate(parts))


def test_alltoall_even_and_uneven_splits(job):
    size, ranks, _ = job
    sent = [cases.values(r, "int32", 6 * size).reshape(2 * size, 3) for r in range(size)]
    for rank, results in enumerate(ranks):
        expected = np.concatenate([sent[src][2 * rank:2 * rank + 2] for src in range(size)])
        np.testing.assert_array_equal(results["alltoall-even"], expected)
    splits = [[(r + j) % 3 for j in range(size)] for r in range(size)]
    sent = [cases.values(r, "float32", 2 * sum(splits[r])).reshape(sum(splits[r]), 2) for r in range(size)]
    for rank, results in enumerate(ranks):
        blocks = []
        for src in range(size):
            start = sum(splits[src][:rank])
            blocks.append(sent[src][start:start + splits[src][rank]])
        np.testing.assert_array_equal(results["alltoall-uneven"], np.concatenate(blocks))
        np.testing.assert_array_equal(results["alltoall-uneven-received"],
                                      [splits[src][rank] for src in range(size)])


def test_broadcast_from_every_root(job):
    size, ranks, _ = job
    for root in range(size):
        assert_same_everywhere(ranks, f"broadcast-root{root}", cases.values(root, "float64", 1001))
        assert_same_everywhere(ranks, f"broadcast-strided-root{root}", cases.values(root, "float32", 2 * 50_003)[::2])
        assert_same_everywhere(ranks, f"broadcast_-root{root}", cases.values(root, "int8", 50).reshape(5, 10))


def test_reducescatter_uneven_rows(job):
    size, ranks, _ = job
    inputs = [cases.values(r, "float64", 2 * (2 * size + 1)).reshape(2 * size + 1, 2) for r in range(size)]
    for op in ("Sum", "Average"):
        whole = cases.reference_reduce(inputs, op)
        start = 0
        for rank, results in enumerate(ranks):
            rows = 2 + (rank == 0)  # 2n+1 rows: the first rank takes the extra one
            np.testing.assert_array_equal(results[f"reducescatter-{op}"], whole[start:start + rows])
            start += rows


def test_objects_and_topology(job, request):
    size, _, objects = job
    config = request.node.callspec.params["job"][0]
    hosts = 2 if config[3].startswith("cluster") else int(config[2].get("RINGREDUCE_SIMULATED_HOSTS", 1))
    for rank, got in enumerate(objects):
        assert got["broadcast_object"] == [{"from": r, "items": list(range(r + 3))} for r in range(size)]
        assert got["allgather_object"] == [{"rank": r, "text": "x" * r} for r in range(size)]
        assert got["topology"] == cases.expected_topology(size, hosts)[rank]


@pytest.mark.parametrize("np_, mpi", [(2, "mpich"), (3, "mpich"), (2, "openmpi")])
def test_repeated_allreduces_run_again_on_new_values_with_or_without_persistent_collectives(np_, mpi):
    job = run_job(np_, "core/repeated.py", python=python_of(mpi))
    assert job.returncode == 0, job.stderr[-3000:]
    expected = [(np.arange(5) * np_ + 10 * round_).tolist() for round_ in range(3)]
    for rank in range(np_):
        reports = {r["label"]: r for r in map(json.loads, (
            line[len("REPORT "):] for line in job.lines_of(rank) if line.startswith("REPORT ")))}
        assert reports["persistent"]["persistent"] is True  # MPICH 5 and Open MPI 5 have MPI-4's
        assert reports["fallback"]["persistent"] is False
        assert reports["persistent"]["results"] == expected == reports["fallback"]["results"]
        sums = [np.sum([np.arange(7.0) * (r + 1) + round_ for r in range(np_)], axis=0).tolist() for round_ in range(3)]
        assert reports["persistent"]["sums"] == sums == reports["fallback"]["sums"]
        # Without persistent collectives, small allreduces go back to fresh calls on the arrays themselves.
        assert reports["persistent"]["still_repeating"] is True and reports["fallback"]["still_repeating"] is False

