"""Fewer or later synchronisations (stale averaging, local SGD, DiLoCo's outer step, hierarchical
local SGD) through the real rrun and MPI, against replicas simulated in this process."""

import pytest
import torch
import torch_cases

from launch import run_job


def train(out, size, *modes):
    job = run_job(size, "training/torch_averaging.py", out, *modes, timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    return {mode: [torch.load(out / mode / f"rank{rank}.pt") for rank in range(size)] for mode in modes}


SIZE = 4  # ranks: hierarchical local SGD averages pairs and all four


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every option at 4 ranks, in one job."""
    return train(tmp_path_factory.mktemp("averaging"), SIZE, "stale", "stale-plain", "stale-loaded",
                 "local", "local-bf16", "diloco", "hierarchical")


def mean_gradients(replicas, replica=None):
    """The mean over the ranks of their shards' gradients (each on its own replica, or on one)."""
    return [torch.stack(g).mean(0) for g in zip(*(replicas.gradients(r, replica) for r in range(SIZE)), strict=True)]


def same_everywhere(got, step):
    return all(same_bits(at(got[0], step), at(got[r], step)) for r in range(1, SIZE))


def at(saved, step):
    return {name.split(".", 1)[1]: value for name, value in saved.items() if name.startswith(f"{step}.")}


MODEL_BYTES = 4 * sum(p.numel() for p in torch_cases.model().parameters())  # float32


def same_bits(a, b):
    return all(torch.equal(a[name], b[name]) for name in a)


class Replicas:
    """One model and optimizer per rank, each training on its shard of torch_cases' batch."""

    def __init__(self, size):
        self.nets = [torch_cases.model() for _ in range(size)]
        self.opts = [torch_cases.optimizer("sgd", net.parameters()) for net in self.nets]
        self.inputs, self.labels = torch_cases.data()
        self.shard = torch_cases.BATCH // size

    def gradients(self, rank, replica=None):
        """The gradients of rank's shard, on its own replica or on `replica`'s."""
        net = self.nets[rank if replica is None else replica]
        mine = slice(rank * self.shard, (rank + 1) * self.shard)
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(self.inputs[mine]), self.labels[mine]).backward()
        return [p.grad.clone() for p in net.parameters()]

    def average(self, tensors_of, group):
        for tensors in zip(*(tensors_of(rank) for rank in group), strict=True):
            mean = torch.stack(tensors).mean(0)
            for tensor in tensors:
                tensor.data.copy_(mean)

    def parameters(self, rank):
        return list(self.nets[rank].parameters())

    def momenta(self, rank):
        return [self.opts[rank].state[p]["momentum_buffer"] for p in self.parameters(rank)]

    def state(self, rank):
        return {name: p.detach().clone() for name, p in self.nets[rank].named_parameters()}


def assert_close(got, expected):
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["stale", "stale-plain", "stale-loaded"])
def test_stale_averaging_applies_the_last_steps_average_the_same_on_every_rank(trained, mode):
    """The gradients of step t (taken at the weights step t-1 predicted, with prediction) are applied
    at step t+1 to the true weights; after each step the parameters hold the next prediction. Weights
    loaded between steps are the true weights from there on."""
    got = trained[mode]
    replicas, last = Replicas(SIZE), None
    parameters = replicas.parameters(0)
    true = [p.detach().clone() for p in parameters]
    for step in range(torch_cases.STEPS):
        if mode == "stale-loaded" and step == 3:
            with torch.no_grad():
                for p, w, loaded in zip(parameters, true, at(got[0], 1).values(), strict=True):
                    p.copy_(loaded)
                    w.copy_(loaded)
        averaged = mean_gradients(replicas, 0)
        with torch.no_grad():
            for p, w in zip(parameters, true, strict=True):
                p.copy_(w)
        if last is not None:  # the first step applies nothing: no average has arrived
            for p, g in zip(parameters, last, strict=True):
                p.grad = g
            replicas.opts[0].step()
        last = averaged
        with torch.no_grad():
            for p, w in zip(parameters, true, strict=True):
                before = w.clone()
                w.copy_(p)
                if mode != "stale-plain":
                    p.mul_(2).sub_(before)
        for rank in range(SIZE):
            assert_close(at(got[rank], step), replicas.state(0))
        assert same_everywhere(got, step), step
    assert not same_bits(at(got[0], 0), at(got[0], 2))  # it did train
    other = "stale-plain" if mode == "stale" else "stale"
    assert not same_bits(at(got[0], 3), at(trained[other][0], 3))  # prediction changes the path
    for rank in range(SIZE):  # synchronize() after the last step puts the true weights back
        assert_close(at(got[rank], "final"), dict(zip(at(got[rank], 0), true, strict=True)))


@pytest.mark.parametrize("mode", ["local", "local-bf16", "diloco"])
def test_local_sgd_averages_every_period_after_the_warm_up(trained, mode):
    """local-bf16: each average after the first adds the mean of the ranks' changes since the last
    one, as bfloat16, to the model of the last one."""
    got = trained[mode]
    replicas, anchor, outer, last = Replicas(SIZE), None, None, None
    everyone = list(range(SIZE))
    for step in range(torch_cases.STEPS):
        if step < 2:  # warm-up: gradients averaged
            averaged = mean_gradients(replicas)
            for rank in everyone:
                for p, g in zip(replicas.parameters(rank), averaged, strict=True):
                    p.grad = g.clone()
        else:
            for rank in everyone:
                replicas.gradients(rank)
        for opt in replicas.opts:
            opt.step()
        averages = step >= 2 and step % 2 == 0
        if averages and mode == "local-bf16" and last is not None:
            plain = {name: torch.stack([replicas.state(rank)[name] for rank in everyone]).mean(0)
                     for name in replicas.state(0)}
            for i, previous in enumerate(last):
                changes = [replicas.parameters(rank)[i].detach() - previous for rank in everyone]
                previous.add_(torch.stack([c.to(torch.bfloat16).float() for c in changes]).mean(0))
                for rank in everyone:
                    replicas.parameters(rank)[i].data.copy_(previous)
        elif averages:
            replicas.average(replicas.parameters, everyone)
            if mode == "local":
                replicas.average(replicas.momenta, everyone)
            elif mode == "local-bf16":
                last = [p.detach().clone() for p in replicas.parameters(0)]
            elif anchor is None:
                anchor = [p.detach().clone() for p in replicas.parameters(0)]
                outer = torch.optim.SGD(anchor, lr=0.7, momentum=0.9, nesterov=True)
            else:
                for a, p in zip(anchor, replicas.parameters(0), strict=True):
                    a.grad = a.detach() - p.detach()
                outer.step()
                for rank in everyone:
                    for a, p in zip(anchor, replicas.parameters(rank), strict=True):
                        p.data.copy_(a.detach())
        for rank in everyone:
            if mode == "local-bf16":  # the ring adds bfloat16 in its own order
                torch.testing.assert_close(at(got[rank], step), replicas.state(rank), rtol=0, atol=5e-4)
            else:
                assert_close(at(got[rank], step), replicas.state(rank))
        # Identical through the warm-up and right after each average; apart in between.
        assert same_everywhere(got, step) == (step < 2 or averages), step
    # On the wire: the gradients during the warm-up, then the parameters (and with the optimizer
    # state, as many bytes of momentum; with bf16 after the first, half) every second step, nothing
    # in between.
    averaged = MODEL_BYTES * (2 if mode == "local" else 1)
    later = MODEL_BYTES // 2 if mode == "local-bf16" else averaged
    assert got[0]["wire"].tolist() == [MODEL_BYTES, MODEL_BYTES, averaged, 0, later]
    if mode == "local-bf16":  # not the plain average of the models: the bfloat16 rounding shows
        assert not same_bits(at(got[0], 4), plain)


def test_hierarchical_local_sgd_averages_pairs_every_step_and_all_every_second(trained):
    got = trained["hierarchical"]
    replicas = Replicas(4)
    for step in range(torch_cases.STEPS):
        for rank in range(4):
            replicas.gradients(rank)
            replicas.opts[rank].step()
        groups = [[0, 1, 2, 3]] if step % 2 == 0 else [[0, 1], [2, 3]]
        for group in groups:
            replicas.average(replicas.parameters, group)
        for rank in range(4):
            assert_close(at(got[rank], step), replicas.state(rank))
        assert same_bits(at(got[0], step), at(got[1], step)) and same_bits(at(got[2], step), at(got[3], step))
        assert same_bits(at(got[1], step), at(got[2], step)) == (step % 2 == 0), step

