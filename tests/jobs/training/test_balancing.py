"""Dynamic load balancing through the real rrun and MPI: the split of each batch follows the ranks'
speeds, every sample of the epoch is used once, and the update is the one of the whole batch
(tests/jobs/training/torch_balancing.py, where the last rank is made three times slower), against
one process in this one."""

import numpy as np
import pytest
import torch
import torch_cases

from launch import run_job

SAMPLES, BATCH, EPOCHS = 200, 48, 3  # as the worker's
STEPS_PER_EPOCH = 5
# How near the split must come to the speed ratio. The balancer times real steps: on a shared VM a
# rank held up tens of milliseconds in a window moves the split by a few hundredths (CI measured
# 0.69 and 0.85 where 0.75 is due); no balancing at all would leave it at the even split, 0.25 away.
SPLIT_TOLERANCE = 0.1


def train(out, size, *modes):
    job = run_job(size, "training/torch_balancing.py", out, *modes, timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    return {mode: [torch.load(path) for path in sorted((out / mode).glob("rank*.pt"))] for mode in modes}


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return train(tmp_path_factory.mktemp("balancing2"), 2, "plain", "fp16", "powersgd", "syncbn")


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return train(tmp_path_factory.mktemp("balancing3"), 3, "plain", "set")



def assert_settled(shares, expected):
    """The split came to the speed ratio and stayed there: over the last third of the steps each
    rank's median share is within SPLIT_TOLERANCE of its part, and none strays twice as far. A
    median, since a rank held up for a whole window moves that interval's split away and the
    damping brings it back over the next ones (a clean-clone run once ended on 0.60 and 0.67 where
    0.75 is due, one such window before the last)."""
    last_third = np.asarray(shares)[-max(1, len(shares) // 3):]
    median = np.median(last_third, axis=0)
    np.testing.assert_allclose(median, expected, atol=SPLIT_TOLERANCE)
    np.testing.assert_allclose(last_third, np.tile(expected, (len(last_third), 1)), atol=2 * SPLIT_TOLERANCE)
    # The even split must not pass: at 3 ranks it lies within SPLIT_TOLERANCE of two of 3/7, 3/7,
    # 1/7. The slowest rank's share moved at least half the way from the even split to its own.
    even = 1 / len(expected)
    slowest = int(np.argmin(expected))
    assert median[slowest] <= even - (even - expected[slowest]) / 2, median


def one_process(global_batches, norm=None):
    """The same global batches in one process, each the mean over the whole batch (with `norm`
    in the model: BatchNorm over the whole batch)."""
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(SAMPLES, torch_cases.FEATURES, generator=generator)
    labels = torch.randint(0, torch_cases.CLASSES, (SAMPLES,), generator=generator)
    net = torch_cases.model(norm)
    opt = torch_cases.optimizer("sgd", net.parameters())
    for batch in global_batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(features[batch]), labels[batch]).backward()
        opt.step()
    return dict(net.named_parameters())


def cases():
    """(fixture, mode, number of ranks balancing, expected shares, tolerance of the parameters)."""
    return [("two", "plain", [0.75, 0.25], 1e-5), ("two", "fp16", [0.75, 0.25], 2e-3),
            ("two", "powersgd", [0.75, 0.25], 1e-4), ("two", "syncbn", [0.75, 0.25], 1e-5),
            ("three", "plain", [3 / 7, 3 / 7, 1 / 7], 1e-5), ("three", "set", [0.75, 0.25], 1e-5)]


@pytest.mark.parametrize(("job", "mode", "expected", "tolerance"), cases())
def test_balanced_training_equals_one_process_on_the_same_batches(request, job, mode, expected, tolerance):
    ranks = request.getfixturevalue(job)[mode]
    assert len(ranks) == len(expected)  # the set's ranks only
    reference = one_process(ranks[0]["global"], torch.nn.BatchNorm1d(16) if mode == "syncbn" else None)
    for got in ranks:
        for name, value in reference.items():
            torch.testing.assert_close(got["parameters"][name], value.detach(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("job", "mode", "expected", "tolerance"), cases())
def test_the_split_moves_to_the_speed_ratio_and_stays(request, job, mode, expected, tolerance):
    ranks = request.getfixturevalue(job)[mode]
    shares = np.array(ranks[0]["shares"])  # after each step; the same on every rank
    assert all(np.array_equal(np.array(got["shares"]), shares) for got in ranks)
    np.testing.assert_allclose(shares[0], np.full(len(expected), 1 / len(expected)))  # even at first
    assert_settled(shares, expected)
    sizes = np.array([[len(t) for t in got["taken"]] for got in ranks])
    assert (sizes[-1, -4:] < sizes[0, -4:]).all()  # the slow rank takes fewer samples


@pytest.mark.parametrize(("job", "mode", "expected", "tolerance"), cases())
def test_every_sample_of_an_epoch_is_used_once(request, job, mode, expected, tolerance):
    ranks = request.getfixturevalue(job)[mode]
    global_batches = ranks[0]["global"]
    assert len(global_batches) == EPOCHS * STEPS_PER_EPOCH == len(ranks[0]["taken"])
    for step, batch in enumerate(global_batches):
        taken = [index for got in ranks for index in got["taken"][step]]
        assert sorted(taken) == sorted(batch), step  # each sample of the batch by exactly one rank
    for epoch in range(EPOCHS):
        steps = range(epoch * STEPS_PER_EPOCH, (epoch + 1) * STEPS_PER_EPOCH)
        assert sorted(i for step in steps for i in global_batches[step]) == list(range(SAMPLES))


def test_keras_fit_balances_and_equals_one_process(tmp_path):
    """Keras: 2 ranks, the last three times slower, through fit with a BalancedDataset."""
    keras = pytest.importorskip("keras")
    import tf_cases

    job = run_job(2, "training/tf_balancing.py", tmp_path, timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    ranks = [np.load(tmp_path / f"rank{rank}.npz") for rank in range(2)]
    order, sizes = ranks[0]["order"], ranks[0]["batches"]
    global_batches = np.split(order, np.cumsum(sizes)[:-1])
    rng = np.random.default_rng(3)
    x = rng.normal(size=(SAMPLES, tf_cases.FEATURES)).astype(np.float32)
    y = rng.integers(0, tf_cases.CLASSES, size=SAMPLES)
    net = tf_cases.model()
    net.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for batch in global_batches:
        net.train_on_batch(x[batch], y[batch])
    for got in ranks:
        for i, expected in enumerate(net.get_weights()):
            np.testing.assert_allclose(got[f"arr_{i}"], expected, rtol=1e-5, atol=1e-5)
    taken = [np.split(got["taken"], np.cumsum(got["taken_sizes"])[:-1]) for got in ranks]
    for step, batch in enumerate(global_batches):
        assert sorted(np.concatenate([t[step] for t in taken])) == sorted(batch), step
    shares = ranks[0]["shares"]
    np.testing.assert_allclose(shares[0], [0.5, 0.5])
    assert_settled(shares, [0.75, 0.25])

