"""Dynamic load balancing as pure logic, with a stand-in process set: the split of each batch, the
sampler's batches and epoch order, the Keras dataset, and what it refuses to weight."""

import numpy as np
import pytest
import torch
import torch_cases

from ringreduce.training.load_balancing import BalancedBatchSampler, LoadBalancer


class Ranks:
    """Stands for a process set (the split needs only its size and this rank's place)."""

    def __init__(self, size, rank=0):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def test_the_split_is_proportional_whole_and_gives_every_rank_one():
    balancer = LoadBalancer(64, process_set=Ranks(3))
    shares = np.array([0.5, 0.3, 0.2])
    assert balancer.split(64, shares).tolist() == [32, 19, 13]
    assert balancer.split(7, shares).tolist() == [4, 2, 1]
    assert balancer.split(3, shares).tolist() == [1, 1, 1]
    assert balancer.split(64, np.array([0.98, 0.01, 0.01])).tolist() == [62, 1, 1]
    assert balancer.split(64).tolist() == [22, 21, 21]  # at first: even


def test_each_rank_takes_its_own_slice_and_weights_by_it():
    balancers = [LoadBalancer(10, process_set=Ranks(2, rank)) for rank in range(2)]
    slices = []
    for balancer in balancers:
        balancer._decided[0] = np.array([0.7, 0.3])
        slices.append(balancer.take(0, 10))
    assert slices == [(0, 7), (7, 3)]
    assert [b.weight() for b in balancers] == [1.4, 0.6]  # mean over 10 = (1.4 mean_0 + 0.6 mean_1) / 2


def test_a_new_split_applies_an_interval_later_and_a_pipeline_thread_waits_for_it(monkeypatch):
    """Interval 2, from step 10 (a resumed epoch): steps 10-13 split evenly; the exchange after
    step 11 (this rank twice the other's speed) decides steps 14 and 15. Training's own thread asking
    for step 14 before then is an error; a pipeline's thread waits for it."""
    import threading

    from ringreduce import collectives

    exchanged = []

    def allgather(window, name, process_set):
        exchanged.append(window.copy())
        return np.array([window[0], [window[0, 0], 2 * window[0, 1]]])  # the other rank: half the speed

    monkeypatch.setattr(collectives, "allgather", allgather)
    balancer = LoadBalancer(12, interval=2, damping=1.0, process_set=Ranks(2))
    assert [balancer.take(step, 12) for step in (10, 11, 12, 13)] == [(0, 6)] * 4
    with pytest.raises(RuntimeError, match="asked for the split of step 14 at step 10: it reads more than the "
                                           r"balancer's interval \(2\) batches ahead"):
        balancer.take(14, 12)
    ahead = []
    reader = threading.Thread(target=lambda: ahead.append(balancer.take(14, 12)))
    reader.start()
    for _ in range(2):
        balancer.work_done()
        balancer.step_done()
    reader.join(timeout=10)
    assert ahead == [(0, 8)]  # two thirds of 12 for the rank twice as fast
    assert len(exchanged) == 1 and balancer.steps == 12
    np.testing.assert_allclose(balancer.shares, [2 / 3, 1 / 3])
    assert balancer.take(13, 12) == (0, 6)  # still the split decided before it


def test_a_last_batch_too_small_for_every_rank_joins_the_one_before():
    sampler = BalancedBatchSampler(98, LoadBalancer(48, process_set=Ranks(3)), shuffle=False)
    assert [len(b) for b in sampler.global_batches()] == [48, 50]  # 2 left over: not one each for 3 ranks
    assert len(sampler) == 2
    sampler = BalancedBatchSampler(98, LoadBalancer(48, process_set=Ranks(2)), shuffle=False)
    assert [len(b) for b in sampler.global_batches()] == [48, 48, 2]
    assert len(sampler) == 3


def test_the_epochs_order_is_drawn_from_the_seed_and_epoch():
    sampler = BalancedBatchSampler(50, LoadBalancer(10, process_set=Ranks(2)), seed=3)
    first = np.concatenate(sampler.global_batches())
    sampler.set_epoch(1)
    second = np.concatenate(sampler.global_batches())
    assert sorted(first) == sorted(second) == list(range(50)) and not np.array_equal(first, second)
    again = BalancedBatchSampler(50, LoadBalancer(10, process_set=Ranks(2)), seed=3)
    assert np.array_equal(np.concatenate(again.global_batches()), first)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match=r"batch_size \(2\) must be at least the number of ranks \(3\)"):
        LoadBalancer(2, process_set=Ranks(3))
    with pytest.raises(ValueError, match="interval must be at least 1, got 0"):
        LoadBalancer(8, interval=0, process_set=Ranks(2))
    with pytest.raises(ValueError, match=r"damping must be in \(0, 1\], got 0"):
        LoadBalancer(8, damping=0, process_set=Ranks(2))
    with pytest.raises(ValueError, match="2 samples cannot give each of 3 ranks one"):
        BalancedBatchSampler(2, LoadBalancer(8, process_set=Ranks(3)))
    with pytest.raises(RuntimeError, match="has no batch for step"):
        LoadBalancer(8, process_set=Ranks(2)).weight()


def test_keras_dataset_follows_the_epochs_and_refuses_to_be_shuffled():
    pytest.importorskip("keras")
    from ringreduce.tensorflow.keras.balancing import BalancedDataset

    x, y = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10)
    data = BalancedDataset(x, y, LoadBalancer(4, process_set=Ranks(2, rank=1)), seed=1)
    assert len(data) == 3  # 4, 4 and the last 2
    first = [data[i][1] for i in (0, 1, 0, 1, 2)]  # Keras reads the first batches ahead, then from 0 again
    assert np.array_equal(first[0], first[2]) and len(first[4]) == 1
    assert sorted(np.concatenate([data.sampler.global_batches()[i][2:] for i in range(2)])) == sorted(
        np.concatenate(first[2:4]))  # rank 1's halves of the first two batches
    data[0]  # after the last batch: the next epoch, in another order
    assert data.sampler.epoch == 1
    with pytest.raises(ValueError, match="Keras asked for batch 2 after batch 0: call fit with shuffle=False"):
        data[2]


def test_load_balancing_refuses_what_it_cannot_weight():
    import ringreduce.torch as rr

    net = torch_cases.model()
    with pytest.raises(ValueError, match="it takes op=Average and backward_passes_per_step=1"):
        rr.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), backward_passes_per_step=2,
                                load_balancer=LoadBalancer(8, process_set=Ranks(2)))
    with pytest.raises(ValueError, match="the load balancer must split among the optimizer's process set"):
        rr.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                load_balancer=LoadBalancer(8, process_set=Ranks(2)))

