"""Keras mixed precision through DistributedOptimizer: mixed_float16 with a LossScaleOptimizer given
to it, mixed_bfloat16 with a plain optimizer, and float32 to compare, 3 epochs of fit each. At 1 rank the job replays
the whole batch of every step (every rank's shard, in rank order). Usage: tf_mixed_precision.py
RANKS_OF_THE_DATA OUT_DIR; writes rank{r}.json."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ringreduce.tensorflow.keras as rr  # noqa: E402

rr.init()
rank, size = rr.rank(), rr.size()
data_ranks, batch = int(sys.argv[1]), 8


def shard(r):
    rng = np.random.default_rng(r)
    return rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 1)).astype("float32") * 10


def step_major(shards):
    """Batch i of every shard side by side: the whole batch of step i."""
    return np.concatenate([np.concatenate([s[i:i + batch] for s in shards]) for i in range(0, 32, batch)])


if size == 1:  # the replay of a data_ranks-rank job
    parts = [shard(r) for r in range(data_ranks)]
    x, y, batch_size = step_major([p[0] for p in parts]), step_major([p[1] for p in parts]), batch * data_ranks
else:
    (x, y), batch_size = shard(rank), batch
report = {}
for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1, dtype="float32")])
    optimizer = keras.optimizers.SGD(0.05)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0 ** 4)  # no overflow here
    model.compile(optimizer=rr.DistributedOptimizer(optimizer), loss="mse")
    model.fit(x, y, epochs=3, batch_size=batch_size, shuffle=False, verbose=0)
    report[policy] = [v.numpy().astype("float64").ravel().tolist() for v in model.weights]
# The other order of wrapping is refused with a message that says how to wrap instead.
keras.mixed_precision.set_global_policy("mixed_float16")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, dtype="float32")])
model.compile(optimizer=keras.optimizers.LossScaleOptimizer(rr.DistributedOptimizer(keras.optimizers.SGD(0.05))),
              loss="mse")
try:
    model.fit(x, y, batch_size=batch_size, verbose=0)
except ValueError as error:
    report["reversed"] = str(error)
keras.mixed_precision.set_global_policy("float32")
with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:
    json.dump(report, f)
