"""ringreduce.tensorflow's collectives inside tf.function, the Keras callbacks and the tape's
checks, on real ranks. Usage: tf_misc.py OUT_DIR; writes rank{r}.json."""

import json
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
rank, size = rr.rank(), rr.size()
report = {}


@tf.function
def collectives(x, rows):
    return {
        "allreduce": rr.allreduce(x, op=rr.Sum),
        "average": rr.allreduce(x),
        "allgather": rr.allgather(rows),
        "broadcast": rr.broadcast(x, root_rank=size - 1),
        "reducescatter": rr.reducescatter(tf.ones([2 * size + 1, 2]) * float(rank + 1), op=rr.Sum),
        "alltoall": rr.alltoall(tf.range(2 * size) + 100 * rank),
        "grouped": rr.grouped_allreduce([x, 2 * x], op=rr.Sum),
    }


x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3) * (rank + 1))
rows = tf.fill([rank + 1, 3], float(rank))
function = collectives.get_concrete_function(tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([None, 3], tf.float32))
report["static_shapes"] = {k: [None if d is None else int(d) for d in v.shape] if not isinstance(v, list)
                           else [list(t.shape) for t in v] for k, v in function.structured_outputs.items()}
values = collectives(x, rows)
report["values"] = {k: v.numpy().tolist() if not isinstance(v, list) else [t.numpy().tolist() for t in v]
                    for k, v in values.items()}
report["eager_allgather"] = rr.allgather(rows).numpy().tolist()

# BroadcastGlobalVariablesCallback: ranks start from different weights; with a learning rate of
# 0 every rank ends with the root's.
x_data, y_data = (tf_cases.shard(a, rank, size) for a in tf_cases.data())
net = tf_cases.model(seed=rank)
net.compile(optimizer=rr.DistributedOptimizer(keras.optimizers.SGD(0.0)),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Record(keras.callbacks.Callback):
    def __init__(self, key):
        super().__init__()
        self.key = key

    def on_epoch_end(self, epoch, logs=None):
        report.setdefault(self.key, []).append(dict(logs))


net.fit(x_data, y_data, batch_size=8, epochs=2, shuffle=False, verbose=0,
        callbacks=[rr.BroadcastGlobalVariablesCallback(0), Record("raw"), rr.MetricAverageCallback(),
                   Record("averaged")])
report["weights"] = [v.numpy().tolist() for v in net.trainable_variables]

# LearningRateWarmupCallback: the rate it sets before each batch.
rates = []
warm = tf_cases.model()
warm.compile(optimizer=rr.DistributedOptimizer(keras.optimizers.SGD(0.01)),
             loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
warm.fit(x_data, y_data, batch_size=x_data.shape[0] // 4, epochs=3, shuffle=False, verbose=0, callbacks=[
    rr.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2),
    keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: rates.append(
        float(keras.ops.convert_to_numpy(warm.optimizer.learning_rate))))])
report["warmup_rates"] = rates

# A variable that only rank 0's loss uses takes part as zeros on rank 1; one no loss uses stays
# None; an embedding row only rank 0 looks up arrives on every rank as rank 0's slices. Inside a
# graph, built differently on the ranks, that is an error on every rank naming the ranks.
used, sometimes, never = tf.Variable(1.0, name="used"), tf.Variable(2.0, name="sometimes"), tf.Variable(5.0)
table = tf.Variable(tf.ones([3, 2]), name="table")
with tf.GradientTape() as tape:
    loss = used * 3.0 + (sometimes + tf.reduce_sum(tf.gather(table, [2])) if rank == 0 else 0.0)
grads = rr.DistributedGradientTape(tape).gradient(loss, [used, sometimes, never, table])
report["presence"] = {"used": float(grads[0]), "sometimes": float(grads[1]), "never": grads[2] is None,
                      "table": tf.convert_to_tensor(grads[3]).numpy().tolist()}


@tf.function
def graph_gradients():
    with tf.GradientTape() as tape:
        loss = used * 3.0 + (sometimes if rank == 0 else 0.0)
    return rr.DistributedGradientTape(tape).gradient(loss, [used, sometimes])


try:
    graph_gradients()
    report["graph_presence_error"] = None
except tf.errors.OpError as error:
    report["graph_presence_error"] = error.message

# Top-k: 2 of each rank's 8 entries travel, gathered and added up; eagerly and in a tf.function.
sparse = tf.constant(tf_cases.topk_input(rank))
report["topk"] = rr.allreduce(sparse, op=rr.Sum, compression=rr.Compression.topk(0.25), name="topk").numpy().tolist()
report["topk_graph"] = tf.function(lambda t: rr.allreduce(t, compression=rr.Compression.topk(0.25),
                                                          name="topk.graph"))(sparse).numpy().tolist()
# Grouped with a vector, eagerly and in a tf.function: the matrix sparsified, the vector whole.
bias = tf.constant(tf_cases.topk_input(rank)[0])
report["topk_grouped"] = [t.numpy().tolist() for t in rr.grouped_allreduce(
    [sparse, bias], op=rr.Sum, compression=rr.Compression.topk(0.25), name="topk.grouped")]
report["topk_grouped_graph"] = [t.numpy().tolist() for t in tf.function(lambda s, b: rr.grouped_allreduce(
    [s, b], compression=rr.Compression.topk(0.25), name="topk.grouped.graph"))(sparse, bias)]
# With error feedback inside a tf.function: a second call with zeros sends the largest of what the
# first one kept back.
feedback = rr.Compression.error_feedback(rr.Compression.topk(0.25))
summed = tf.function(lambda t: rr.allreduce(t, op=rr.Sum, compression=feedback, name="feedback.graph"))
report["feedback_graph"] = [summed(t).numpy().tolist() for t in (sparse, tf.zeros_like(sparse))]

with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(report, f)
