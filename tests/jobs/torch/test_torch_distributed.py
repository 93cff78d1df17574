"""ringreduce as a torch.distributed backend, and rrun as torchrun, through the real rrun and MPI
(tests/jobs/torch/torch_distributed.py): every call torch.distributed makes on it against numpy,
at 2, 3 and 4 ranks, on the job's group, on a subgroup and on a 2 x 2 device mesh, beside a
Horovod-style call; DDP equal to one process on the whole batch; the torchrun variables; a call
whose shapes differ, a MismatchError on every rank; and the same script on gloo."""

import socket

import numpy as np
import pytest
import torch
import torch_cases

from launch import run_job


def job(tmp_path_factory, size, backend):
    out = tmp_path_factory.mktemp(f"{backend}{size}")
    result = run_job(size, "torch/torch_distributed.py", out, backend, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(size)]


@pytest.fixture(scope="module", params=[2, 3, 4])
def ringreduce_job(request, tmp_path_factory):
    return request.param, job(tmp_path_factory, request.param, "ringreduce")


def base(rank):
    return np.arange(6, dtype=np.float32) + 10 * rank


def expected_calls(rank, size):
    bases = [base(r) for r in range(size)]
    total = np.sum(bases, axis=0)
    scattered = np.sum([np.arange(2.0 * size) * (r + 1) for r in range(size)], axis=0)
    return {
        "all_reduce.SUM": total, "all_reduce.AVG": total / size, "all_reduce.MIN": bases[0],
        "all_reduce.MAX": bases[-1], "all_reduce.PRODUCT": np.prod([b % 3 + 1 for b in bases], axis=0),
        "all_reduce.PREMUL_SUM.number": total / 2, "all_reduce.PREMUL_SUM.tensor": total / 4,
        "reduce_scatter_tensor.PREMUL_SUM": 2 * scattered[2 * rank:2 * rank + 2],
        "all_reduce.async": total.astype(np.float64), "all_reduce.future": total.astype(np.float64),
        "broadcast": bases[-1], "all_gather": np.stack(bases), "all_gather_into_tensor": np.concatenate(bases),
        "reduce_scatter_tensor": scattered[2 * rank:2 * rank + 2],
        "all_to_all_single": np.array([rank + 10.0 * j for j in range(size)]),
        "all_to_all": np.concatenate([np.full(rank + 1, float(j)) for j in range(size)]),
        "reduce": total if rank == 0 else bases[rank],
        "gather": np.stack(bases) if rank == 0 else np.zeros(0),
        "scatter": np.full(3, float(rank)),
        **({"send_recv": np.zeros(4)} if rank < 2 else {}),
        **({"ends.all_reduce": np.full(3, float(size - 1)), "ends.broadcast": np.full(2, float(size - 1)),
            "ends.all_gather": np.array([0.0, size - 1.0])} if rank in (0, size - 1) else {}),
        # A 2 x 2 mesh: "data" groups ranks 0 and 2, 1 and 3; "model" 0 and 1, 2 and 3.
        **({"mesh.data": np.array([2.0 * (rank % 2) + 2]), "mesh.model": np.array([4.0 * (rank // 2) + 1])}
           if size == 4 else {}),
        "horovod_style": np.full(2, float(sum(range(size)))),
        **({"recv_any": np.array([[r, r, r] for r in range(1, size)], dtype=np.float32)} if rank == 0 else {}),
        "all_gather_coalesced": np.concatenate([np.concatenate([b[:2], b]) for b in bases]),
        "sparse_all_reduce": np.array([*range(1, size + 1), size], dtype=np.float32),
        "batch_isend_irecv": np.full(2, float((rank - 1) % size)),
        "isend_irecv": np.array([2.0 * ((rank + 1) % size)]),
    }


def test_every_call_gives_what_numpy_gives_on_every_rank(ringreduce_job):
    size, ranks = ringreduce_job
    for rank, results in enumerate(ranks):
        got = results["calls"]
        for call, expected in expected_calls(rank, size).items():
            np.testing.assert_array_equal(got[call].numpy(), expected, err_msg=f"{call} on rank {rank} of {size}")
        assert got["all_gather_object"] == [{"rank": r} for r in range(size)]
        offsets = sum(range(size))
        np.testing.assert_array_equal(got["all_reduce.in_flight"].numpy(), np.repeat(
            [[offsets + size * i] for i in range(len(got["all_reduce.in_flight"]))], 3, axis=1))
        np.testing.assert_array_equal(got["all_reduce.loop"].numpy(), np.repeat(
            [[offsets + size * step] for step in range(len(got["all_reduce.loop"]))], 5, axis=1))
        # The loop's second lap of names (half its calls) known to the response cache: before, no name came twice.
        assert got["all_reduce.loop_cache_hits"] >= len(got["all_reduce.loop"]), got["all_reduce.loop_cache_hits"]
        assert got["all_reduce.BXOR"] == ("all_reduce with BXOR on the ringreduce backend: it serves SUM, AVG, MIN, "
                                          "MAX, PRODUCT and PREMUL_SUM")


def test_each_rank_gets_torchruns_variables_from_rrun(ringreduce_job):
    size, ranks = ringreduce_job
    environments = [results["environment"] for results in ranks]
    for rank, environment in enumerate(environments):
        assert environment == {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
                               "LOCAL_WORLD_SIZE": str(size), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": environments[0]["MASTER_PORT"]}
    assert 0 < int(environments[0]["MASTER_PORT"]) < 65536


@pytest.mark.parametrize("ringreduce_job", [4], indirect=True)
def test_tensor_parallel_on_a_2d_mesh_matches_one_process(ringreduce_job):
    """torch.distributed.tensor.parallel's column and row split over the mesh's "model" dimension:
    the output and one SGD step's weights are one unsplit process's, on every rank."""
    size, ranks = ringreduce_job
    model = torch_cases.model()
    inputs, labels = torch_cases.data()
    output = model(inputs)
    torch.nn.functional.cross_entropy(output, labels).backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    first, last = (name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    split = {f"{first}.weight": (8, 8), f"{first}.bias": (8,), f"{last}.weight": (4, 8), f"{last}.bias": (4,)}
    for rank, results in enumerate(ranks):
        got = results["calls"]["tensor_parallel"]
        assert got["parts"] == split, f"rank {rank} holds {got['parts']}, not half of each split dimension"
        torch.testing.assert_close(got["output"], output.detach(), msg=f"output on rank {rank}")
        for name, value in model.named_parameters():
            torch.testing.assert_close(got["weights"][name], value.detach(), msg=f"{name} on rank {rank}")


def test_a_call_past_the_groups_timeout_is_torchs_error_naming_it():
    """init_process_group(timeout=...) bounds every wait, as on torch's own backends: a rank whose
    peer never comes gets DistBackendError (a RuntimeError) naming the call, not a hang."""
    result = run_job(2, "torch/torch_timeout.py", "2", timeout=60)
    said = "ringreduce: rank 0: torch.distributed.0.allreduce.0.0 did not finish within 2 s"
    assert result.returncode != 0
    assert f"raised DistBackendError: {said}" in result.stdout, result.stdout + result.stderr[-2000:]
    # The group is broken: the rank's exit ends the job at once (rank 1 sleeps a minute).
    assert f"rrun: rank 0 (on {socket.gethostname()}) failed first: exited with status 1; its last error line: {said}" \
        in result.stderr, result.stderr[-2000:]



def test_ddp_trains_as_one_process_on_the_whole_batch(ringreduce_job):
    torch_cases.assert_ddp_equals_one_process(*ringreduce_job)


def test_a_call_whose_shapes_differ_is_a_mismatch_naming_them_on_every_rank(ringreduce_job):
    size, ranks = ringreduce_job
    for results in ranks:
        assert results["mismatch"].startswith("MismatchError: allreduce 'torch.distributed.0.allreduce."), \
            results["mismatch"]
        assert "shape (3,) on rank 0 but (4,) on rank 1" in results["mismatch"]


def test_a_torchrun_script_on_gloo_runs_unchanged_under_rrun(tmp_path_factory):
    torch_cases.assert_ddp_equals_one_process(2, job(tmp_path_factory, 2, "gloo"))


# (how, tolerance against one process): the fp16 and bf16 hooks round each gradient on the wire;
# PowerSGD approximates them, so only that the replicas stay the same is checked for it.
WRAPPED = [("fp16", 2e-3), ("bf16", 2e-2), ("powersgd", None), ("post_local_sgd", 1e-5), ("zero", 1e-5),
           ("fsdp2", 1e-5)]


@pytest.mark.parametrize("ringreduce_job", [2], indirect=True)
@pytest.mark.parametrize(("how", "tolerance"), WRAPPED)
def test_ddp_s_hooks_zero_and_fsdp2_train_with_identical_replicas(ringreduce_job, how, tolerance):
    size, ranks = ringreduce_job
    reference, initial = torch_cases.one_process_on_slices(size), dict(torch_cases.model().named_parameters())
    for rank, results in enumerate(ranks):
        for name, value in results["wrapped"][how].items():
            assert torch.equal(value, ranks[0]["wrapped"][how][name]), f"{how}: {name} differs on rank {rank}"
            assert not torch.equal(value, initial[name].detach()), f"{how}: {name} did not train"
        if how in ("fp16", "bf16"):  # the hook ran: its rounding shows against plain DDP
            assert any(not torch.equal(value, results["ddp"][name]) for name, value in results["wrapped"][how].items())
            if tolerance is not None:
                torch.testing.assert_close(value, reference[name], rtol=tolerance, atol=tolerance,
                                           msg=f"{how}: {name} on rank {rank}")
