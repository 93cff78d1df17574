"""ringreduce.tensorflow called the way Horovod's users call horovod.tensorflow and
horovod.tensorflow.keras, eagerly and in a tf.compat.v1 graph; writes what each call gave.
Usage: horovod_tf.py OUT_DIR; writes rank{r}.json."""

import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
import ringreduce.tensorflow as hvd  # noqa: E402
import ringreduce.tensorflow.keras as hvd_keras  # noqa: E402

import cases  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
out = {}


def listed(value):
    return np.asarray(value).tolist()


class Doubling(hvd.Compression.none):
    """A compressor of the user's own."""

    @staticmethod
    def compress(tensor):
        return tensor * 2, "doubled"

    @staticmethod
    def decompress(tensor, ctx):
        return tensor / 2


x = tf.constant(np.arange(6, dtype=np.float32) * (rank + 1))
# Horovod's positional order: tensor, average, device_dense, device_sparse, compression, op.
out["positional"] = listed(hvd.allreduce(x, None, "", "", hvd.Compression.none, hvd.Sum))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out["average-false"] = listed(hvd.allreduce(x, average=False))
out["warned"] = [issubclass(w.category, DeprecationWarning) for w in caught]
out["compressed"] = listed(hvd.allreduce(x, compression=Doubling, op=hvd.Sum))
out["fp16"] = listed(hvd.allreduce(x, compression=hvd.Compression.fp16, op=hvd.Sum))
for dtype in (tf.int32, tf.int64):
    whole = tf.cast(tf.range(2 * size) + 10 * rank, dtype)
    results = {"allreduce": hvd.allreduce(whole, op=hvd.Sum), "allgather": hvd.allgather(whole),
               "broadcast": hvd.broadcast(whole, 0), "alltoall": hvd.alltoall(whole),
               "reducescatter": hvd.reducescatter(whole, op=hvd.Sum)}
    out[f"dtypes-{dtype.name}"] = {k: v.dtype.name for k, v in results.items()}
slices = tf.IndexedSlices(tf.fill([rank + 1, 2], float(rank + 1)), tf.range(rank + 1), dense_shape=[4, 2])
gathered = hvd.allreduce(slices, op=hvd.Average)
out["slices"] = {"values": listed(gathered.values), "indices": listed(gathered.indices),
                 "dense": listed(tf.convert_to_tensor(gathered))}
out["ops"] = [int(hvd.size_op()), int(hvd.rank_op()), int(hvd.local_size_op()), int(hvd.local_rank_op())]
try:
    hvd.allreduce(tf.ones([rank + 2]), name="mismatched")
except tf.errors.OpError as error:
    out["op_error"] = [type(error).__name__, isinstance(error, hvd.MismatchError), error.message]
variable = tf.Variable(np.full(3, float(rank), np.float32))
hvd.broadcast_([variable], root_rank=size - 1)
out["broadcast_"] = listed(variable)
out["keras_values"] = listed(hvd_keras.allreduce(np.arange(3.0) * (rank + 1), average=False))
try:
    hvd.broadcast_global_variables(0)
except RuntimeError as error:
    out["eager_global_variables"] = str(error)


@tf.function
def mismatched_in_function():
    return hvd.allreduce(tf.ones([rank + 2]), name="mismatched.function")


def mismatched_in_session():
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        return session.run(hvd.allgather(tf.ones([2, rank + 2]), name="mismatched.session"))


# Horovod's op errors: a mismatch is tf.errors.FailedPreconditionError, eagerly (also ringreduce's
# MismatchError), in tf.function and in a tf.compat.v1 session.
errors = {}
for label, call in (("eager", lambda: hvd.allreduce(tf.ones([rank + 2]), name="mismatched.eager")),
                    ("function", mismatched_in_function),
                    ("session", mismatched_in_session),
                    ("slices-min", lambda: hvd.allreduce(slices, op=hvd.Min)),
                    ("slices-scaled", lambda: hvd.allreduce(slices, op=hvd.Sum, prescale_factor=2.0))):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the test checks the classes
        errors[label] = [cls.__name__ for cls in (tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError,
                                                  NotImplementedError, hvd.MismatchError) if isinstance(error, cls)]
out["errors"] = errors
out["executing_eagerly"] = hvd._executing_eagerly()

# Local sources keep their own gradient, divided by the size; an embedding's is tf.IndexedSlices.
embedding = tf.keras.layers.Embedding(4, 2, embeddings_initializer="ones")
dense = tf.keras.layers.Dense(1, kernel_initializer="ones")
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(dense(embedding(tf.constant([[rank % 4]])))) * (rank + 1)
tape = hvd.PartialDistributedGradientTape(tape, local_layers=[embedding])
local, shared, _ = tape.gradient(loss, embedding.trainable_weights + dense.trainable_weights)
out["partial_tape"] = {"local": listed(tf.convert_to_tensor(local)), "shared": listed(shared)}

# Keras: _compute_gradients averages once (apply_gradients takes them as they are), local
# variables keep theirs (divided by the size); the callback leaves local variables alone.
w_shared, w_local = tf.Variable([0.0]), tf.Variable([0.0])
keras_opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(1.0))
keras_opt.register_local_var(w_local)
pairs = keras_opt._compute_gradients(lambda: (w_shared + w_local) * (rank + 1.0), [w_shared, w_local])
keras_opt.apply_gradients(pairs, experimental_aggregate_gradients=False)
out["keras_local"] = [listed(w_shared), listed(w_local)]
model = tf.keras.Sequential([tf.keras.Input((2,)),
                             tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(rank))])
model.compile(optimizer=hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.0)), loss="mse")
kept = model.layers[0].bias
kept.assign([float(rank)])
model.fit(np.ones((2, 2)), np.ones((2, 1)), verbose=0,
          callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(size - 1, local_variables=[kept])])
out["callback_local"] = [listed(model.layers[0].kernel), listed(kept)]

# An elastic state goes back to what sync() gave.
state = hvd_keras.elastic.KerasState(model, batch=rank)
state.sync()
model.layers[0].kernel.assign(tf.fill([2, 1], 42.0))
state.batch = 99
state.restore()
out["elastic_restore"] = [listed(model.layers[0].kernel), state.batch]



def gradient(collective, values, weights):
    """d/d values of sum(weights * collective(values)), through the collective."""
    with tf.GradientTape() as tape:
        tape.watch(values)
        result = collective(values)
        loss = tf.reduce_sum(result * weights(len(result)))
    return tape.gradient(loss, values)


mine = tf.constant(cases.contribution(rank))
w = lambda n=6: tf.constant(cases.weights(rank, n))  # noqa: E731
grads = {
    "allreduce-sum": gradient(lambda v: hvd.allreduce(v, op=hvd.Sum), mine, w),
    "allreduce-average": gradient(lambda v: hvd.allreduce(v, op=hvd.Average), mine, w),
    "allgather": gradient(lambda v: hvd.allgather(v), mine[:rank + 1], w),
    "broadcast": gradient(lambda v: hvd.broadcast(v, size - 1), mine, w),
    "reducescatter": gradient(lambda v: hvd.reducescatter(v, op=hvd.Sum), mine, w),
    "alltoall": gradient(lambda v: hvd.alltoall(v, splits=cases.splits(rank, size))[0], mine, w),
    "alltoall-equal": gradient(hvd.alltoall, tf.constant(cases.equal_split_contribution(rank, size)), w),
}
with tf.GradientTape() as tape:
    pair = [tf.identity(mine), tf.identity(mine)]
    tape.watch(pair)
    summed = hvd.grouped_allreduce(pair, op=hvd.Sum)
    grads["grouped"] = tf.stack(tape.gradient(tf.reduce_sum(summed[0] * w() + summed[1] * 2 * w()), pair))
out["grads"] = {k: listed(v) for k, v in grads.items()}
out["grads"]["alltoall-received"] = listed(hvd.alltoall(mine, splits=cases.splits(rank, size))[1])

# A tf.compat.v1 graph: more independent collectives than inter-op threads, the global
# variables broadcast, and a v1 optimizer's step.
with tf.Graph().as_default():
    independent = [hvd.allreduce(tf.constant([float(rank + i)]), op=hvd.Sum, name=f"independent.{i}")
                   for i in range(8)]
    weights = tf.compat.v1.get_variable("weights", initializer=tf.constant([float(rank), 1.0]))
    broadcast_all = hvd.broadcast_global_variables(0)
    features = tf.constant([[1.0 + rank, 2.0]])
    loss = tf.reduce_sum(tf.matmul(features, tf.reshape(weights, [2, 1])))
    optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
    step = optimizer.minimize(loss)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    with tf.compat.v1.Session(config=config) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        out["graph_independent"] = [listed(v) for v in session.run(independent)]
        session.run(broadcast_all)
        out["graph_broadcast"] = listed(session.run(weights))
        session.run(step)
        out["graph_step"] = listed(session.run(weights))

# Broadcast gradients in a graph, root after root in one session: off the root the gradient is
# computed from the allreduce's value, so every rank runs it (zeros of its shape alone would not).
with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    broadcast_grads = []
    for root in range(size):
        source = tf.ones([3]) * rank
        broadcast_grads.append(listed(session.run(tf.gradients(hvd.broadcast(source, root), source,
                                                               tf.ones([3]))[0])))
    out["graph_broadcast_grads"] = broadcast_grads

with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
