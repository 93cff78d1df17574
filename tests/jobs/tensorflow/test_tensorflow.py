"""ringreduce.tensorflow and its Keras module under real ranks, compared with plain TensorFlow
computed here and with numpy."""

import json
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import tf_cases  # noqa: E402
from launch import EXAMPLES, run_job  # noqa: E402


def single_process_weights(stale=False, predict=False):
    """Plain TensorFlow, one process, the whole batch every step: what 2 ranks must reproduce.
    `stale`: each step applies the last step's gradients (zeros at the first); `predict`: the
    weights are left one more update ahead after each step, and taken back before the next."""
    x, y = tf_cases.data()
    net = tf_cases.model()
    optimizer = keras.optimizers.SGD(0.1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    last = [tf.zeros_like(v) for v in net.trainable_variables]
    updates = [tf.zeros_like(v) for v in net.trainable_variables]
    for step in range(tf_cases.STEPS):
        rows = slice(step * tf_cases.BATCH, (step + 1) * tf_cases.BATCH)
        with tf.GradientTape() as tape:
            loss = loss_fn(y[rows], net(x[rows]))
        gradients = tape.gradient(loss, net.trainable_variables)
        applied, last = (last, gradients) if stale else (gradients, None)
        for variable, update in zip(net.trainable_variables, updates, strict=True):
            variable.assign_sub(update)
        before = [tf.identity(v) for v in net.trainable_variables]
        optimizer.apply_gradients(zip(applied, net.trainable_variables, strict=True))
        if predict:
            updates = [v - b for v, b in zip(net.trainable_variables, before, strict=True)]
            for variable, update in zip(net.trainable_variables, updates, strict=True):
                variable.assign_add(update)
    return [v.numpy() for v in net.trainable_variables]


@pytest.fixture(scope="module")
def reference():
    return single_process_weights()


# (run, tolerance): each trains 2 ranks with half a batch each, which must equal one process with all.
EQUAL_TO_ONE_PROCESS = {
    "tape-none": 1e-5,
    "fit-none": 1e-5,
    "fit2-none": 1e-5,  # backward_passes_per_step=2
    "tape-fp16": 2e-3,
    "tape-bf16": 2e-2,
    "tape-powersgd": 1e-4,  # of a rank that holds each gradient whole
    "fit-powersgd": 1e-4,
    "local-sync-none": 1e-5,  # the weights of plain SGD averaged after every batch
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every training run of these tests, one after another in one job (TensorFlow starts once)."""
    out = tmp_path_factory.mktemp("tf_train")
    runs = [*EQUAL_TO_ONE_PROCESS, "local-none", "local-outer1-none", "local-diloco-none", "local-hier-none",
            "local-bf16-none",
            "fit-stale-none", "fit-stale-plain-none", "fit-stale-fp16", "fit-stale-own16"]
    job = run_job(2, "tensorflow/tf_train.py", out, *runs, timeout=240)
    assert job.returncode == 0, job.stderr[-3000:]
    return {run: [[got[f"arr_{i}"] for i in range(len(got.files))] for got in
                  (np.load(out / run / f"rank{rank}.npz") for rank in range(2))] for run in runs}


@pytest.mark.parametrize("run", list(EQUAL_TO_ONE_PROCESS))
def test_two_ranks_with_half_a_batch_equal_one_process_with_all(trained, reference, run):
    tolerance = EQUAL_TO_ONE_PROCESS[run]
    for weights in trained[run]:
        for value, expected in zip(weights, reference, strict=True):
            np.testing.assert_allclose(value, expected, rtol=tolerance, atol=tolerance)
        if run.endswith(("fp16", "bf16")):  # the gradients really went through float16 or bfloat16
            assert any(not np.array_equal(v, e) for v, e in zip(weights, reference, strict=True))


@pytest.mark.parametrize("predict", [True, False])
def test_keras_stale_averaging_applies_the_last_batchs_average(trained, reference, predict):
    stale = single_process_weights(stale=True, predict=predict)
    for weights in trained["fit-stale-none" if predict else "fit-stale-plain-none"]:
        for value, expected in zip(weights, stale, strict=True):
            np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5)
    assert not all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(stale, reference, strict=True))
    other = single_process_weights(stale=True, predict=not predict)
    assert not all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(stale, other, strict=True))


@pytest.mark.parametrize("compression", ["fp16", "own16"])
def test_keras_stale_averaging_takes_compression_the_engines_or_ones_own(trained, compression):
    """The options' one rule (ringreduce.training.options): staleness=1 goes with any compression
    but PowerSGD and top-k, as in torch."""
    stale = single_process_weights(stale=True, predict=True)
    first, second = trained[f"fit-stale-{compression}"]
    for value, theirs, expected in zip(first, second, stale, strict=True):
        np.testing.assert_array_equal(value, theirs)
        np.testing.assert_allclose(value, expected, rtol=2e-2, atol=2e-2)
    assert any(not np.array_equal(v, e) for v, e in zip(first, trained["fit-stale-none"][0], strict=True))


def test_keras_local_sgd_averages_every_second_batch_and_ends_the_same_on_every_rank(trained, reference):
    """5 batches, averaged after batches 0, 2 and 4: the ranks end equal, elsewhere than
    synchronous SGD."""
    first, second = trained["local-none"]
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(first, reference, strict=True))


def test_keras_local_sgd_with_bf16_changes_ends_the_same_on_every_rank_near_the_full_average(trained):
    """Averages after batches 0 (in full), 2 and 4 (the changes as bfloat16)."""
    first, second = trained["local-bf16-none"]
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    full = trained["local-none"][0]
    for value, expected in zip(first, full, strict=True):
        np.testing.assert_allclose(value, expected, rtol=0, atol=2e-3)
    # bfloat16's rounding shows, far beyond what float32 changes would differ by (about 1e-7 here)
    assert max(np.abs(a - b).max() for a, b in zip(first, full, strict=True)) > 1e-5


def test_keras_hierarchical_local_sgd_averages_each_group_at_its_period(trained):
    """{1: 1, 2: 2} at 2 ranks: each rank alone after every batch (nothing to average), both after
    every second: exactly local SGD with period 2."""
    for hierarchical, periodic in zip(trained["local-hier-none"], trained["local-none"], strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(hierarchical, periodic, strict=True))


def test_keras_local_sgd_with_an_outer_optimizer_steps_from_the_last_average(trained):
    """An outer SGD of rate 1 moves its copy exactly to each average: plain local SGD again. DiLoCo's
    outer Nesterov ends elsewhere, the same on every rank."""
    plain = trained["local-none"][0]
    for weights in trained["local-outer1-none"]:
        for value, expected in zip(weights, plain, strict=True):
            np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-6)
    first, second = trained["local-diloco-none"]
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(first, plain, strict=True))


@pytest.fixture(scope="module")
def misc(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf_misc")
    job = run_job(2, "tensorflow/tf_misc.py", out, timeout=150)
    assert job.returncode == 0, job.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_collectives_inside_tf_function_keep_static_shapes_and_values(misc):
    x = [np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1) for r in range(2)]
    for rank, got in enumerate(misc):
        assert got["static_shapes"] == {"allreduce": [2, 3], "average": [2, 3], "allgather": [None, 3],
                                        "broadcast": [2, 3], "reducescatter": [None, 2], "alltoall": [None],
                                        "grouped": [[2, 3], [2, 3]]}
        values = got["values"]
        np.testing.assert_array_equal(values["allreduce"], x[0] + x[1])
        np.testing.assert_array_equal(values["average"], (x[0] + x[1]) / 2)
        expected_gather = np.concatenate([np.full((r + 1, 3), float(r)) for r in range(2)])
        np.testing.assert_array_equal(values["allgather"], expected_gather)
        np.testing.assert_array_equal(got["eager_allgather"], expected_gather)
        np.testing.assert_array_equal(values["broadcast"], x[1])
        np.testing.assert_array_equal(values["reducescatter"], np.full((3 - rank, 2), 3.0))  # 5 rows: 3 and 2
        np.testing.assert_array_equal(values["alltoall"], [2 * rank, 2 * rank + 1, 100 + 2 * rank, 101 + 2 * rank])
        np.testing.assert_array_equal(values["grouped"][1], 2 * (x[0] + x[1]))


def test_broadcast_callback_makes_differently_initialised_ranks_equal(misc):
    root = [v.numpy() for v in tf_cases.model(seed=0).trainable_variables]
    other = [v.numpy() for v in tf_cases.model(seed=1).trainable_variables]
    assert not np.array_equal(root[0], other[0])  # they really started apart
    for got in misc:  # learning rate 0: what the broadcast gave is what stays
        for value, expected in zip(got["weights"], root, strict=True):
            np.testing.assert_array_equal(value, expected)


def test_metric_average_callback_averages_the_logged_metrics(misc):
    for epoch in range(2):
        mean = np.mean([got["raw"][epoch]["loss"] for got in misc])
        assert misc[0]["raw"][epoch]["loss"] != misc[1]["raw"][epoch]["loss"]
        for got in misc:
            assert got["averaged"][epoch]["loss"] == pytest.approx(mean, rel=1e-12)


def test_learning_rate_warmup_ramps_from_a_share_to_the_full_rate(misc):
    # 2 ranks, 4 batches an epoch, 2 warm-up epochs: 0.4 / 2 * (e * (2 - 1) / 2 + 1), e = epoch + batch / 4
    expected = [0.2 * (1 + (i / 4) / 2) for i in range(8)] + [0.4] * 4
    for got in misc:
        np.testing.assert_allclose(got["warmup_rates"], expected, rtol=1e-6)


def test_a_gradient_missing_on_some_ranks_counts_as_zeros_there_and_inside_a_graph_is_an_error(misc):
    size = len(misc)
    for got in misc:
        assert got["presence"]["used"] == 3.0
        assert got["presence"]["sometimes"] == 1.0 / size  # rank 0's 1, the others' zeros, averaged
        assert got["presence"]["never"] is True
        table = np.zeros((3, 2))
        table[2] = 1.0 / size
        np.testing.assert_allclose(got["presence"]["table"], table)
        error = got["graph_presence_error"]
        assert error is not None and "inside a graph, a gradient must be present on every rank or on none" in error
        assert "sometimes" in error and "None on rank 1 but not on rank 0" in error


def test_top_k_sends_each_ranks_largest_entries_and_adds_them_up_and_a_vector_whole(misc):
    kept = []
    for rank in range(2):
        values = tf_cases.topk_input(rank)
        largest = np.argsort(-np.abs(values), axis=None)[:2]
        kept.append(np.where(np.isin(np.arange(8), largest).reshape(2, 4), values, 0))
    for got in misc:
        np.testing.assert_allclose(got["topk"], kept[0] + kept[1], rtol=1e-6)
        np.testing.assert_allclose(got["topk_graph"], (kept[0] + kept[1]) / 2, rtol=1e-6)
        vectors = [tf_cases.topk_input(rank)[0] for rank in range(2)]  # travel whole
        for key, scale in (("topk_grouped", 1), ("topk_grouped_graph", 2)):
            np.testing.assert_allclose(got[key][0], (kept[0] + kept[1]) / scale, rtol=1e-6)
            np.testing.assert_allclose(got[key][1], (vectors[0] + vectors[1]) / scale, rtol=1e-6)


def test_error_feedback_inside_tf_function_sends_what_it_kept_back_at_the_next_call(misc):
    sent = [[], []]  # per rank, per call: its top 2 of its input plus what it kept back
    for rank in range(2):
        values = tf_cases.topk_input(rank).astype(np.float64)
        residual = np.zeros_like(values)
        for given in (values, np.zeros_like(values)):
            corrected = given + residual
            largest = np.argsort(-np.abs(corrected), axis=None)[:2]
            kept = np.where(np.isin(np.arange(8), largest).reshape(2, 4), corrected, 0)
            residual = corrected - kept
            sent[rank].append(kept)
    for got in misc:
        for call in range(2):
            np.testing.assert_allclose(got["feedback_graph"][call], sent[0][call] + sent[1][call], rtol=1e-6)
    assert not np.allclose(misc[0]["feedback_graph"][0], misc[0]["feedback_graph"][1])


def test_keras_digits_example_reaches_95_percent(tmp_path):
    job = run_job(2, os.path.join(EXAMPLES, "tensorflow_keras_digits.py"), "--epochs", "12", timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    line = job.lines_of(0)[-1]
    assert line.startswith("test accuracy"), job.stdout[-2000:]
    assert float(line.split()[2].rstrip("%")) >= 95.0, line


def test_gradient_tape_example_trains_identical_weights_on_every_rank():
    job = run_job(2, os.path.join(EXAMPLES, "tensorflow_gradient_tape.py"), timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    line = job.lines_of(0)[-1]
    assert line.endswith("weights identical on every rank: True"), job.stdout[-2000:]
    assert float(line.split()[2].rstrip("%")) >= 85.0, line


def test_mixed_precision_keeps_the_replicas_equal_to_one_process(tmp_path):
    """A LossScaleOptimizer given to DistributedOptimizer (mixed_float16) and a plain one under
    mixed_bfloat16 (and float32): after 3 epochs every rank holds the same weights, those of one
    process that trains on the whole batch of each step. (Before the fix, the loss-scaled
    replicas differed by 1.3 after 3 epochs: their gradients were never averaged.)"""
    for ranks, folder in ((2, tmp_path / "job"), (1, tmp_path / "replay")):
        folder.mkdir()
        job = run_job(ranks, "tensorflow/tf_mixed_precision.py", "2", folder, timeout=150)
        assert job.returncode == 0, job.stderr[-3000:]
    replay = json.loads((tmp_path / "replay" / "rank0.json").read_text())
    for rank in range(2):
        got = json.loads((tmp_path / "job" / f"rank{rank}.json").read_text())
        assert got.pop("reversed").endswith(
            "wrap the other way round, DistributedOptimizer(LossScaleOptimizer(optimizer))")
        replay.pop("reversed", None)
        for policy, weights in got.items():
            for mine, theirs in zip(weights, json.loads((tmp_path / "job" / "rank0.json").read_text())[policy],
                                    strict=True):
                assert mine == theirs, (policy, rank)  # the replicas, bit for bit
            # Measured: 9e-8 in float32, 3e-4 in float16, 0.04 in bfloat16 (8 bits of mantissa).
            tolerance = {"float32": 1e-6, "mixed_float16": 2e-3, "mixed_bfloat16": 0.1}[policy]
            for mine, alone in zip(weights, replay[policy], strict=True):
                np.testing.assert_allclose(mine, alone, rtol=0, atol=tolerance, err_msg=policy)

