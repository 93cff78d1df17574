"""Data-parallel TensorFlow training on this rank's shard, one run after another in one job; saves
each run's final weights to OUT_DIR/RUN/rank{r}.npz. Usage: tf_train.py OUT_DIR RUN...

A RUN is MODE-COMPRESSION: MODE one of tape, fit, fit2 (backward_passes_per_step=2), fit-stale
(staleness=1), fit-stale-plain (staleness=1, weight_prediction=False), local-sync and local
(LocalSGDCallback, averaging every batch and every second), local-outer1 and local-diloco (local,
with an outer SGD of rate 1, and DiLoCo's outer Nesterov), local-bf16 (local, the averages'
changes as bfloat16), local-hier (HierarchicalLocalSGDCallback {1: 1, 2: 2}: each rank alone after
every batch, both after every second);
COMPRESSION a name in rr.Compression, powersgd, or own16 (a float16 cast of the user's own, which
runs around the collective, not in the engine)."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ringreduce.tensorflow.keras as rr  # noqa: E402

import tf_cases  # noqa: E402

rr.init()
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class OwnFloat16:
    @staticmethod
    def compress(tensor):
        return tf.cast(tensor, tf.float16), tensor.dtype

    @staticmethod
    def decompress(tensor, dtype):
        return tf.cast(tensor, dtype)


def compressor(name):
    if name == "own16":
        return OwnFloat16
    if name == "powersgd":  # a rank that holds every gradient whole: exactly the plain average
        return rr.PowerSGD(matrix_approximation_rank=16, start_powerSGD_iter=0, min_compression_rate=0)
    return getattr(rr.Compression, name)


def train(mode, compression):
    x, y = (tf_cases.shard(a, rr.rank(), rr.size()) for a in tf_cases.data())
    net = tf_cases.model()
    if mode == "tape":
        optimizer = keras.optimizers.SGD(0.1)

        @tf.function
        def step(features, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, net(features))
            gradients = rr.DistributedGradientTape(tape, compression=compression).gradient(
                loss, net.trainable_variables)
            optimizer.apply_gradients(zip(gradients, net.trainable_variables, strict=True))

        rows = len(x) // tf_cases.STEPS
        for i in range(tf_cases.STEPS):
            step(x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows])
    elif mode.startswith("local"):  # local-sync: local SGD averaging after every batch; local: every second
        net.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss_fn)
        outer = {"local-outer1": keras.optimizers.SGD(1.0),  # moves the copy exactly to the average
                 "local-diloco": keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)}.get(mode)
        averaging = rr.HierarchicalLocalSGDCallback({1: 1, 2: 2}) if mode == "local-hier" else rr.LocalSGDCallback(
            period=2, warmup_steps=tf_cases.STEPS if mode == "local-sync" else 0, outer_optimizer=outer,
            compression=rr.Compression.bf16 if mode == "local-bf16" else rr.Compression.none)
        net.fit(x, y, batch_size=tf_cases.BATCH // rr.size(), epochs=1, shuffle=False, verbose=0,
                callbacks=[averaging])
    else:
        passes = 2 if mode == "fit2" else 1
        net.compile(optimizer=rr.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=compression,
                                                      backward_passes_per_step=passes,
                                                      average_aggregated_gradients=True,
                                                      staleness=int(mode.startswith("fit-stale")),
                                                      weight_prediction=mode == "fit-stale"), loss=loss_fn)
        # With k passes per step, k batches of 1/k the rows make one step of the same global batch
        # (their gradients averaged, not summed as Horovod's default).
        net.fit(x, y, batch_size=tf_cases.BATCH // rr.size() // passes, epochs=1, shuffle=False, verbose=0)
    if isinstance(compression, rr.PowerSGD):
        assert compression.iteration == tf_cases.STEPS and sorted(compression.qs) == sorted(
            getattr(v, "path", v.name) for v in net.trainable_variables if len(v.shape) == 2), compression.qs
    return [v.numpy() for v in net.trainable_variables]


out = sys.argv[1]
for run in sys.argv[2:]:
    mode, compression = run.rsplit("-", 1)
    weights = train(mode, compressor(compression))
    os.makedirs(os.path.join(out, run), exist_ok=True)
    np.savez(os.path.join(out, run, f"rank{rr.rank()}.npz"), *weights)
