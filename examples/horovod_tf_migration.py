"""A TensorFlow 2 custom training loop written against Horovod's documented API, run by
ringreduce: the import line is the only change. A tf.function step with
DistributedGradientTape, and the broadcast of rank 0's variables after the first step.

    rrun -np 2 python examples/horovod_tf_migration.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ringreduce.tensorflow as hvd  # noqa: E402  (was: import horovod.tensorflow as hvd)

hvd.init()
tf.random.set_seed(hvd.rank())  # different on every rank: the broadcast after the first step fixes that

teacher = np.random.default_rng(7).standard_normal((8, 1)).astype(np.float32)
features = np.random.default_rng(hvd.rank()).standard_normal((256, 8)).astype(np.float32)
targets = features @ teacher
dataset = tf.data.Dataset.from_tensor_slices((features, targets)).batch(32).repeat(4)

model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
loss_fn = keras.losses.MeanSquaredError()
optimizer = keras.optimizers.SGD(0.05 * hvd.size())


@tf.function
def training_step(x, y, first_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = hvd.DistributedGradientTape(tape)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(optimizer.variables, root_rank=0)
    return loss


losses = [float(training_step(x, y, step == 0)) for step, (x, y) in enumerate(dataset)]
first, last = (hvd.allreduce(tf.constant(v), name=n).numpy() for v, n in ((losses[0], "first"), (losses[-1], "last")))
kernel = model.trainable_variables[0]
same = bool(np.allclose(hvd.allreduce(kernel, name="kernel").numpy(), kernel.numpy(), atol=1e-6))
if hvd.rank() == 0:
    print(f"loss {first:.4f} -> {last:.4f}; every rank holds the same model: {same}")
