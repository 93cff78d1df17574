"""Load-balanced Keras fit under real ranks: each rank's model sleeps in its forward pass for every
sample of its batch (3 ms; the last rank 9 ms, standing for a device three times slower: long
beside the step's own time in TensorFlow, which does not grow with the batch). Saves the final weights,
the global batches, the samples each step took on this rank and the balancer's shares after each
step to OUT_DIR/rankR.npz. Usage: tf_balancing.py OUT_DIR"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ringreduce.tensorflow.keras as rr  # noqa: E402

import tf_cases  # noqa: E402

SAMPLES, BATCH, EPOCHS = 200, 48, 8  # 11 intervals: the split settles (damping 0.5) well before the last

rr.init()
rng = np.random.default_rng(3)
x = rng.normal(size=(SAMPLES, tf_cases.FEATURES)).astype(np.float32)
y = rng.integers(0, tf_cases.CLASSES, size=SAMPLES)
slow = rr.rank() == rr.size() - 1


class Noted(rr.BalancedDataset):
    """Notes which samples each step took."""

    taken = {}  # step -> this rank's dataset indices (Keras asks for the first batches twice)

    def __getitem__(self, index):
        mine = self.indices(index)
        self.taken[self.sampler.epoch * len(self) + index] = mine
        return x[mine], y[mine]


class Sleep(keras.layers.Layer):
    """Takes its time per sample of the batch in the forward pass, and passes the batch on."""

    def call(self, inputs):
        def sleep(count):
            time.sleep((0.009 if slow else 0.003) * count)
            return np.float32(0)
        slept = tf.numpy_function(sleep, [tf.shape(inputs)[0]], tf.float32, stateful=True)
        return inputs + tf.reshape(slept, [])

    def compute_output_shape(self, input_shape):
        return input_shape


class Record(keras.callbacks.Callback):
    def __init__(self, balancer):
        super().__init__()
        self.balancer, self.shares = balancer, []

    def on_train_batch_end(self, batch, logs=None):
        self.shares.append(self.balancer.shares.copy())


balancer = rr.LoadBalancer(BATCH, interval=3)
data = Noted(x, y, balancer, seed=5)
global_batches = []
for epoch in range(EPOCHS):
    data.sampler.set_epoch(epoch)
    global_batches += data.sampler.global_batches()
data.sampler.set_epoch(0)
net = keras.Sequential([keras.Input((tf_cases.FEATURES,)), Sleep(), tf_cases.model()])  # tf_cases' weights
net.compile(optimizer=rr.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), load_balancer=balancer),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
record = Record(balancer)
net.fit(data, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[record])
np.savez(os.path.join(sys.argv[1], f"rank{rr.rank()}.npz"), *[v.numpy() for v in net.trainable_variables],
         shares=np.array(record.shares), batches=np.array([len(b) for b in global_batches]),
         order=np.concatenate(global_batches), taken_sizes=np.array([len(data.taken[s]) for s in sorted(data.taken)]),
         taken=np.concatenate([data.taken[s] for s in sorted(data.taken)]))
