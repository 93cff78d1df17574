"""The model and data of the PyTorch tests: the workers train with them on their shard, the
tests train the single-process reference with the whole batch."""

import numpy as np
import torch

import cases

BATCH, FEATURES, CLASSES, STEPS = 32, 8, 4, 5


def model(norm=None):
    """The MLP, with `norm` (a batch norm of 16 features) after its first layer if given."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), *([norm] if norm is not None else []), torch.nn.Tanh(),
                               torch.nn.Linear(16, CLASSES))


def data():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, FEATURES, generator=generator), torch.randint(0, CLASSES, (BATCH,), generator=generator)


def optimizer(kind, parameters):
    if kind == "adam":
        return torch.optim.Adam(parameters, lr=0.01)
    if kind == "adamw":
        return torch.optim.AdamW(parameters, lr=0.01, weight_decay=0.1)
    return torch.optim.SGD(parameters, lr=0.1, momentum=0.9)


def train(net, opt, batches_per_step):
    """STEPS steps; each step runs backward on `batches_per_step` consecutive slices of the data
    (each loss divided by their number, so that their gradients add up to the mean's)."""
    inputs, labels = data()
    for _ in range(STEPS):
        opt.zero_grad()
        for x, y in batches_per_step:
            loss = torch.nn.functional.cross_entropy(net(inputs[x:y]), labels[x:y]) / len(batches_per_step)
            loss.backward()
        opt.step()
    return {name: p.detach().clone() for name, p in net.named_parameters()}



def as_after_broadcast(opt):
    """`opt` as broadcast_optimizer_state leaves a fresh optimizer, by Horovod's rule: one step
    with zero gradients taken (Adam's step count 1), the gradients left zero."""
    for group in opt.param_groups:
        for parameter in group["params"]:
            parameter.grad = torch.zeros_like(parameter)
    opt.step()
    return opt


def contribution(rank):
    return torch.from_numpy(cases.contribution(rank))


def weights(rank, count=6):
    return torch.from_numpy(cases.weights(rank, count))


def tensor_parallel_inputs():
    """x (6 x 8) and W (8 x 3) of a row-parallel product x @ W."""
    generator = torch.Generator().manual_seed(2)
    return torch.randn(6, 8, generator=generator), torch.randn(8, 3, generator=generator)


def linear():
    """The Linear(8, 4) that the tensor-parallel layers split."""
    torch.manual_seed(3)
    return torch.nn.Linear(8, 4)


def batch_norm_input(rank):
    """A rank's batch of 5 rows of 3 channels for the SyncBatchNorm tests."""
    return torch.randn(5, 3, generator=torch.Generator().manual_seed(10 + rank)) * (rank + 1)


def feedback_gradient(rank, step):
    """A gradient that float16 cannot hold exactly (thirds, of several magnitudes), per rank and step."""
    rng = np.random.default_rng([rank, step])
    return (rng.integers(1, 1000, 64) / 3 * 10.0 ** rng.integers(-3, 1, 64)).astype(np.float32)


def narrow_values(rank, count):
    """float32 values of several magnitudes per rank, whose sums over a few ranks float16 holds."""
    rng = np.random.default_rng([rank, count])
    return (rng.standard_normal(count) * 10.0 ** rng.integers(-3, 3, count)).astype(np.float32)


def one_process_on_slices(size):
    """train's result in one process on the samples that `size` ranks' equal slices make up (the
    first BATCH // size * size): what data parallelism over them must reach."""
    net = model()
    return train(net, optimizer("sgd", net.parameters()), [(0, BATCH // size * size)])


def assert_ddp_equals_one_process(size, ranks):
    """Every rank's DDP weights (`ranks`: what each saved, under "ddp") are the one process's, and
    the same bits on every rank."""
    reference = one_process_on_slices(size)
    for rank, results in enumerate(ranks):
        for name, value in results["ddp"].items():
            torch.testing.assert_close(value, reference[name], rtol=1e-5, atol=1e-6, msg=f"{name} on rank {rank}")
            assert torch.equal(value, ranks[0]["ddp"][name]), f"{name} differs between rank 0 and rank {rank}"


def assert_torchrun_across_two_hosts(ranks):
    """tests/jobs/torch/torch_distributed.py's results with one rank on each of two hosts:
    torchrun's variables name each rank's host, rank 0's address (not loopback) is the rendezvous,
    and DDP trains as one process."""
    environments = [results["environment"] for results in ranks]
    assert [(e["GROUP_RANK"], e["LOCAL_RANK"], e["GROUP_WORLD_SIZE"]) for e in environments] == [
        ("0", "0", "2"), ("1", "0", "2")]
    assert environments[0]["MASTER_ADDR"] == environments[1]["MASTER_ADDR"] != "127.0.0.1"
    assert_ddp_equals_one_process(2, ranks)
