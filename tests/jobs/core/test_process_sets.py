"""Process sets through the real rrun and MPI at 2, 3 and 4 ranks: every collective on sets given
to init, added later, overlapping, of one rank and of every rank reversed, submitted in different
orders on different ranks, against numpy; and each misuse, an error on the ranks involved (never
a hang)."""

import json

import numpy as np
import pytest

import cases
from launch import cluster_missing, python_of, require_cluster, run_job


@pytest.fixture(scope="module", params=[(2, "mpich"), (3, "mpich"), (4, "mpich"), (3, "openmpi"), (4, "cluster")],
                ids=["mpich-2", "mpich-3", "mpich-4", "openmpi-3", "two-hosts-4"])
def job(request, tmp_path_factory):
    size, mpi = request.param
    on_cluster = mpi == "cluster"
    if on_cluster and cluster_missing():
        require_cluster(cluster_missing())
    out = tmp_path_factory.mktemp(f"sets-{mpi}-{size}")
    result = run_job(size, "core/process_sets.py", out, python=python_of("mpich" if on_cluster else mpi), timeout=120,
                     rrun_args=("-H", "hosta:2,hostb:2", "--network-interface", "rrnet0") if on_cluster else (),
                     on_cluster=on_cluster)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [dict(np.load(out / f"rank{r}.npz")) for r in range(size)]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(size)]
    return size, ranks, reports


def set_ranks(size):
    """Each set's sorted global ranks, and the id every rank must give it: init's sets in the order
    given (the one of every rank is the global set, 0), then the added ones."""
    at_init, added = cases.process_set_layout(size)
    ranks, ids = {"global": list(range(size))}, {"global": 0}
    for key, given in (at_init | added).items():
        ranks[key] = sorted(given)
        ids[key] = 0 if ranks[key] == ranks["global"] else max(ids.values()) + 1
    return ranks, ids


def test_sets_know_their_ranks_ids_and_members(job):
    size, _, reports = job
    ranks_of, ids = set_ranks(size)
    for rank, report in enumerate(reports):
        info = report["info"]
        for key, members in ranks_of.items():
            assert info[key]["ranks"] == members, (key, rank)
            assert info[key]["id"] == ids[key], (key, rank)
            assert info[key]["size"] == len(members)
            assert info[key]["included"] == (rank in members)
            assert info[key]["rank"] == (members.index(rank) if rank in members else None)


def test_every_collective_on_every_set_matches_numpy(job):
    size, ranks, _ = job
    for key, members in set_ranks(size)[0].items():
        n = len(members)
        for rank in members:
            got = ranks[rank]
            np.testing.assert_array_equal(got[f"{key}-sum"], cases.reference_reduce(
                [cases.values(r, "float64", 1003) for r in members], "Sum"), err_msg=f"{key} rank {rank}")
            np.testing.assert_array_equal(got[f"{key}-average"], cases.reference_reduce(
                [cases.values(r, "float32", 17) for r in members], "Average"))
            np.testing.assert_array_equal(got[f"{key}-max"], cases.reference_reduce(
                [cases.values(r, "int32", 40) for r in members], "Max"))
            np.testing.assert_array_equal(got[f"{key}-allgather"], np.concatenate(
                [cases.values(r, "int64", 2 * (r + 1)).reshape(-1, 2) for r in members]))
            np.testing.assert_array_equal(got[f"{key}-broadcast"], cases.values(members[-1], "float64", 31))
            whole = cases.reference_reduce(
                [cases.values(r, "float32", 3 * (2 * n + 1)).reshape(-1, 3) for r in members], "Sum")
            mine = members.index(rank)
            start = 2 * mine + (mine > 0)  # 2n+1 rows: the set's first rank takes the extra one
            np.testing.assert_array_equal(got[f"{key}-reducescatter"], whole[start:start + 2 + (mine == 0)])
            sent = {r: cases.values(r, "int32", 2 * n).reshape(n, 2) for r in members}
            np.testing.assert_array_equal(got[f"{key}-alltoall"],
                                          np.concatenate([sent[r][mine:mine + 1] for r in members]))
            np.testing.assert_array_equal(got[f"{key}-grouped"], np.concatenate([cases.reference_reduce(
                [cases.values(r, "float64", length) for r in members], "Sum") for length in (5, 7)]))


def test_objects_on_sets_use_global_root_ranks(job):
    size, _, reports = job
    for key, members in set_ranks(size)[0].items():
        for rank in members:
            info = reports[rank]["info"][key]
            assert info["object"] == {"from": members[0]}
            assert info["objects"] == [10 * r for r in members]


def test_a_set_busy_on_one_rank_is_not_removed_anywhere_and_is_removed_once_idle_and_join_within_it(job):
    size, ranks, reports = job
    for report in reports:
        assert report["info"]["removed-global"] is False
        if size == 2:  # no set of several ranks but the global one
            continue
        kind, text = report["errors"]["remove-busy"]
        assert kind == "ValueError" and "requests are in flight on rank 1" in text
        assert f"ranks {', '.join(map(str, range(1, size)))}" in text
        assert report["info"]["removed-tail"] is True
        assert report["info"]["removed-tail-again"] is False
        kind, text = report["errors"]["use-removed"]
        assert kind == "ValueError" and "not a process set of this job" in text
    for rank in range(1, size if size > 2 else 1):
        np.testing.assert_array_equal(ranks[rank]["tail-late"], np.full(4, sum(range(1, size)), np.float64))
        if rank != 1:  # rank 1 joined: zeros in its place
            np.testing.assert_array_equal(ranks[rank]["tail-joined"], np.full(2, sum(range(2, size)), np.float64))
        assert reports[rank]["info"]["tail-join"] in range(2, size)  # a global rank of the set that joined last
    for rank in range(size):
        np.testing.assert_array_equal(ranks[rank]["after-global"], cases.reference_reduce(
            [cases.values(r, "float64", 9) for r in range(size)], "Sum"))
    for rank in range(0, size, 2):
        np.testing.assert_array_equal(ranks[rank]["after-evens"], cases.reference_reduce(
            [cases.values(r, "float64", 9) for r in range(0, size, 2)], "Sum"))


def test_misuse_is_a_clear_error_on_the_ranks_involved(job):
    size, _, reports = job
    for rank, report in enumerate(reports):
        errors = report["errors"]
        if "not-a-member" in errors:
            kind, text = errors["not-a-member"]
            assert kind == "ValueError" and f"rank {rank} is not in process set" in text
        if rank % 2 == 0:
            kind, text = errors["root-outside"]
            assert kind == "ValueError" and "root_rank 1 is not a rank in process set 1" in text
        kind, text = errors["never-added"]
        assert kind == "ValueError" and "add_process_set" in text
        kind, text = errors["disagree"]  # on every rank, naming who passed what
        assert kind == "ValueError"
        assert f"[0] on rank 0 but [{size - 1}] on rank" in text
        kind, text = errors["duplicate"]
        assert kind == "ValueError" and "exists already" in text
        kind, text = errors["outside-the-job"]
        assert kind == "ValueError" and f"0 to {size - 1}" in text
        kind, text = errors["changes-differ"]
        others = "rank 1" if size == 2 else "ranks " + ", ".join(map(str, range(1, size)))
        assert kind == "ValueError" and text == (
            "the ranks are not making the same process set change: add_process_set (at process_sets.py:75) on "
            f"rank 0 but remove_process_set (at process_sets.py:75) on {others}")
    assert any("not-a-member" in report["errors"] for report in reports)


def test_a_mismatch_within_a_set_is_an_error_on_its_ranks_naming_the_set():
    job = run_job(3, "core/mismatch.py", "--catch", "set-shapes", timeout=90)
    assert job.returncode == 0, job.stderr[-3000:]
    expected = ("set-shapes: caught MismatchError: allreduce 'grad' in process set 1 does not match across ranks: "
                "shape (4,) on rank 1 but (3,) on rank 2")
    for rank in (1, 2):
        assert any(line.startswith(expected) for line in job.lines_of(rank)), job.lines_of(rank)
    assert "set-shapes: no error" in job.lines_of(0)
    for rank in range(3):
        assert "set-shapes: afterwards sum = [3.0, 3.0]" in job.lines_of(rank)


def test_torch_groups_train_apart_and_a_row_parallel_product_sums_within_its_set(tmp_path):
    """Two data-parallel groups ([0, 1] and [2, 3]) each equal one process training on the group's
    half of the batch; the row-parallel product and its gradient match torch's on one process;
    send/recv and isend/irecv within each group."""
    torch = pytest.importorskip("torch")
    import torch_cases

    job = run_job(4, "core/torch_sets.py", tmp_path, timeout=150)
    assert job.returncode == 0, job.stderr[-3000:]
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    half = torch_cases.BATCH // 2
    x, w = torch_cases.tensor_parallel_inputs()
    y = x @ w
    for rank in range(4):
        group, member = rank // 2, rank % 2
        net = torch_cases.model()
        fresh = torch_cases.as_after_broadcast(torch_cases.optimizer("adam", net.parameters()))
        reference = torch_cases.train(net, fresh, [(half * group, half * (group + 1))])
        for name, value in reference.items():
            torch.testing.assert_close(got[rank][name], value, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[rank]["y"], y, rtol=1e-5, atol=1e-5)
        rows = slice(4 * member, 4 * (member + 1))
        # d/dW of the sum over the set's two ranks of sum(y * y)
        torch.testing.assert_close(got[rank]["w_grad"], 2 * (x[:, rows].T @ (2 * y)), rtol=1e-4, atol=1e-4)
        first = 2 * group
        assert got[rank]["allgather"].tolist() == [float(first), float(first + 1), float(first + 1)]
    assert not torch.equal(got[0]["0.weight"], got[2]["0.weight"])  # the groups trained apart
    for rank in (1, 3):
        assert got[rank]["recv-from"].item() == got[rank]["irecv-from"].item() == rank - 1
        torch.testing.assert_close(got[rank]["recv"], torch.arange(6.0).reshape(2, 3) + rank - 1)
        torch.testing.assert_close(got[rank]["irecv"], torch.full((4,), rank - 0.5, dtype=torch.bfloat16))
    for group in ((0, 1), (2, 3)):  # SyncBatchNorm on the set: BatchNorm of the group's batches together
        inputs = [torch_cases.batch_norm_input(r).requires_grad_(True) for r in group]
        norm = torch.nn.BatchNorm1d(3)
        y = norm(torch.cat(inputs))
        (y * torch.cat([torch_cases.batch_norm_input(r + 20) for r in group])).sum().backward()
        for index, rank in enumerate(group):
            torch.testing.assert_close(got[rank]["norm-y"], y.detach()[5 * index:5 * (index + 1)])
            assert inputs[index].grad.abs().max() > 0.1
            torch.testing.assert_close(got[rank]["norm-x_grad"], inputs[index].grad)
            torch.testing.assert_close(got[rank]["norm-running_mean"], norm.running_mean)
    whole = torch_cases.linear()
    x = torch_cases.tensor_parallel_inputs()[0].requires_grad_(True)
    y = whole(x)
    (y * y).sum().backward()
    for rank in range(4):
        member = rank % 2
        for kind, dim in (("column", 0), ("row", 1)):
            torch.testing.assert_close(got[rank][f"{kind}-y"], y.detach(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got[rank][f"{kind}-x_grad"], x.grad, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got[rank][f"{kind}-w_grad"], whole.weight.grad.chunk(2, dim)[member],
                                       rtol=1e-5, atol=1e-5)


def test_tensorflow_collectives_broadcast_and_tape_on_sets(tmp_path):
    pytest.importorskip("tensorflow")
    job = run_job(3, "core/tf_sets.py", tmp_path, timeout=150)
    assert job.returncode == 0, job.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    x = {r: [float(v) * (r + 1) for v in (1, 2, 3)] for r in range(3)}
    for rank, members in ((0, [0, 1]), (1, [0, 1]), (2, [2])):
        got = reports[rank]
        assert got["sum"] == [sum(x[m][i] for m in members) for i in range(3)]
        assert got["gathered"] == [x[m] for m in members]
        assert got["variable"] == [float(members[-1])] * 2
        assert got["gradient"] == pytest.approx([sum(x[m][i] for m in members) / len(members) for i in range(3)])
        assert got["size_op"] == len(members)
    assert reports[1]["recv-from"] == 0 and reports[1]["recv"] == [[1, 2], [3, 4]]


def test_a_stall_within_a_set_names_the_set_and_its_global_ranks():
    job = run_job(3, "core/set_stall.py", env={"RINGREDUCE_STALL_CHECK_TIME": "1"}, timeout=60)
    assert job.returncode == 0, job.stderr[-3000:]
    expected = "allreduce 'late.grad' in process set 1 (set_stall.py:1"
    for rank in (1, 2):
        lines = job.lines_of(rank, "stderr")
        assert any(expected in line and "): submitted by rank 1" in line and "still missing from rank 2" in line
                   for line in lines), lines


def test_a_rank_that_leaves_with_sets_made_ends_the_others_plain_wait():
    """Rank 1 ends its program while ranks 0 and 2 wait for it in a plain barrier of the whole job,
    with a set of ranks 0 and 1 still made: its shutdown tells every domain at once, so the others
    get PeerExitedError at once (before, rank 1 waited in that set's shutdown for rank 0, which
    waited in the barrier for rank 1: both until the job was killed)."""
    job = run_job(3, "core/set_leaving.py", timeout=60)
    for rank in (0, 2):
        assert (f"rank {rank} caught PeerExitedError: rank 1 shut down while rank {rank} waited in plain barrier"
                in "\n".join(job.lines_of(rank))), job.stderr[-3000:]
