"""horovod.torch's behaviour under ringreduce.torch, at 1, 2 and 3 ranks through rrun and MPI,
each result compared with a reference computed here: calls in Horovod's positional order, the
deprecated `average=`, the async, grouped and in-place forms, compressors, errors Horovod users
catch, build queries, the timeline, and gradients through every collective against the
analytic gradient of the sum of the ranks' losses."""

import json

import pytest

torch = pytest.importorskip("torch")

import torch_cases  # noqa: E402

import cases  # noqa: E402
from launch import run_job  # noqa: E402

X = torch_cases.contribution


@pytest.fixture(scope="module", params=[1, 2, 3])
def job(request, tmp_path_factory):
    """(ranks, output folder) of one job per rank count, both parts of the worker in it."""
    out = tmp_path_factory.mktemp(f"horovod_torch{request.param}")
    result = run_job(request.param, "torch/horovod_torch.py", out, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    return request.param, out


def saved(out, part, np):
    return [torch.load(out / part / f"rank{r}.pt") for r in range(np)]


def test_horovod_style_calls(job):
    np, out = job
    everyone = [X(r) for r in range(np)]
    total = sum(everyone)
    for rank, got in enumerate(saved(out, "calls", np)):
        torch.testing.assert_close(got["positional"], total)  # prescale 2, postscale 0.5
        torch.testing.assert_close(got["positional_"], total)
        torch.testing.assert_close(got["reducescatter"], total[cases.scattered_rows(rank, np)])
        torch.testing.assert_close(got["average-false"], total)
        torch.testing.assert_close(got["average-true"], total / np)
        assert got["warned"].tolist() == [True, True]
        assert got["both"] == "give op, or the deprecated average, not both"
        torch.testing.assert_close(got["grouped_allreduce_"], [total, total[:2]])
        torch.testing.assert_close(got["grouped_allgather"], [torch.cat([X(r)[:r + 1] for r in range(np)]),
                                                              torch.cat([X(r)[:1] for r in range(np)])])
        torch.testing.assert_close(got["grouped_reducescatter"], [total[cases.scattered_rows(rank, np)],
                                                                  2 * total[cases.scattered_rows(rank, np)]])
        torch.testing.assert_close(got["allgather_async"], torch.cat([X(r)[:r + 1] for r in range(np)]))
        torch.testing.assert_close(got["broadcast_async"], X(np - 1))
        torch.testing.assert_close(got["reducescatter_async"], total[cases.scattered_rows(rank, np)])
        torch.testing.assert_close(got["grouped_allreduce_async"], [total, total])
        torch.testing.assert_close(got["grouped_allgather_async"], [torch.cat([X(r)[:1] for r in range(np)])])
        torch.testing.assert_close(got["grouped_reducescatter_async"], [total[cases.scattered_rows(rank, np)]])
        torch.testing.assert_close(got["alltoall_async"], torch.cat(
            [torch.arange(2.0 * rank, 2.0 * rank + 2) + 10 * r for r in range(np)]))
        torch.testing.assert_close(got["broadcast_async_"], X(0))
        torch.testing.assert_close(got["compressed"], total)
        assert got["compressor_calls"].item() == 1
        torch.testing.assert_close(got["fp16"], total, rtol=1e-3, atol=1e-2)
        assert got["fp16"].dtype == torch.float32 and got["fp16_compress"].item()
        if np > 1:
            assert "allreduce 'mismatched' does not match across ranks: shape" in got["internal_error"]
        assert "Adasum is not offered by ringreduce; use Average (or Sum) (called at horovod_torch.py:" in got["adasum"]
        for kind in ("allreduce", "allgather", "broadcast", "reducescatter"):
            assert f"{kind} 'twice.{kind}' was submitted on rank {rank} while a request of that name is still " \
                   "in flight" in got[f"twice-{kind}"]
        assert got["joined"].item() == np - 1  # the ranks joined in rank order
        assert got["joined_last"].item() == saved(out, "calls", np)[0]["joined_last"].item()  # the same everywhere
        assert np == 1 or got["joined_last"].item() != 0  # rank 0 joined first: another joined last
        if rank > 0:
            exact = sum(-(2 * r + 1) for r in range(1, np)) / np
            assert got["int_average"].tolist() == [int(exact)]  # toward zero: -1 for -1.5 at 2 ranks
        assert got["parameter_names"] == ["allreduce.noname.0.0", "allreduce.noname.0.1", "allreduce.noname.1.0",
                                          "allreduce.noname.1.1"]
        assert len(got["step_warning"]) == 1
        assert got["step_warning"][0].startswith("optimizer.step() called without optimizer.skip_synchronize()")
        torch.testing.assert_close(got["outside_weight"], torch.full((1, 2), -float(rank)))
        assert got["built"].tolist() == [True, True, False, False, False, True, True]
    events = [json.loads(line.rstrip(",")) for line in (out / "timeline.json").read_text().splitlines()[1:]
              if line.startswith("{")]
    assert any(e.get("name") == "ALLREDUCE" and e.get("args", {}).get("tensor") == "timed" for e in events)


def test_gradients_through_the_collectives_are_the_analytic_ones(job):
    np, out = job
    for rank, got in enumerate(saved(out, "grads", np)):
        for key, expected in cases.expected_gradients(rank, np).items():
            if key == "alltoall-received":
                assert got[key].tolist() == expected
            else:
                torch.testing.assert_close(got[key], torch.as_tensor(expected), msg=key)
