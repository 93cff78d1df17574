"""A Keras training script written against Horovod's documented API, run by ringreduce: the
import line is the only change. model.fit with Horovod's callbacks (the broadcast of rank 0's
weights, metric averaging, learning-rate warm-up) and the wrapped optimizer.

    rrun -np 2 python examples/horovod_keras_migration.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ringreduce.tensorflow.keras as hvd  # noqa: E402  (was: import horovod.tensorflow.keras as hvd)

hvd.init()
keras.utils.set_random_seed(100 + hvd.rank())  # different on every rank: the first callback fixes that

teacher = np.random.default_rng(7).standard_normal((16, 3)).astype(np.float32)
features = np.random.default_rng(hvd.rank()).standard_normal((512, 16)).astype(np.float32)
labels = (features @ teacher).argmax(axis=1)

model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)])
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05 * hvd.size(), momentum=0.9))
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.05 * hvd.size(), warmup_epochs=2, verbose=1),
]
history = model.fit(features, labels, batch_size=32, epochs=6, callbacks=callbacks,
                    verbose=2 if hvd.rank() == 0 else 0)

weights = np.concatenate([w.reshape(-1) for w in model.get_weights()])
same = bool(np.allclose(hvd.allreduce(weights, average=True, name="weights"), weights, atol=1e-6))
if hvd.rank() == 0:
    print(f"accuracy {history.history['accuracy'][0]:.3f} -> {history.history['accuracy'][-1]:.3f}; "
          f"every rank holds the same model: {same}")
