"""Train a small Keras network on scikit-learn's handwritten digits with model.fit, data-parallel.

    rrun -np 2 python examples/tensorflow_keras_digits.py

The changes from a single-process script are marked "ringreduce": init, each rank fitting its
own shard, the wrapped optimizer (its learning rate scaled by the number of ranks), and the
callbacks that start every rank from rank 0's weights and average the logged metrics.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up notices off the log

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import ringreduce.tensorflow.keras as rr  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=15)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.001, help="for one rank; scaled by the number of ranks")
args = parser.parse_args()

rr.init()  # ringreduce
threads = max(1, (os.cpu_count() or 1) // rr.local_size())  # share the cores of a node
tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(threads)
keras.utils.set_random_seed(1234 + rr.rank())  # different on purpose: the broadcast makes them equal

digits = load_digits()
images = (digits.images / 16.0).astype(np.float32)[..., None]
train_x, test_x, train_y, test_y = train_test_split(images, digits.target, test_size=0.2, random_state=0,
                                                    stratify=digits.target)
# ringreduce: each rank fits its own shard of the training set and evaluates its shard of the test set.
train_x, train_y = train_x[rr.rank()::rr.size()], train_y[rr.rank()::rr.size()]
test_x, test_y = test_x[rr.rank()::rr.size()], test_y[rr.rank()::rr.size()]

model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.MaxPooling2D(2),
    keras.layers.Flatten(),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
])
optimizer = rr.DistributedOptimizer(keras.optimizers.Adam(args.lr * rr.size()))  # ringreduce
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
callbacks = [rr.BroadcastGlobalVariablesCallback(root_rank=0),  # ringreduce
             rr.MetricAverageCallback()]  # ringreduce: logged metrics are averages over ranks
model.fit(train_x, train_y, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
          verbose=2 if rr.rank() == 0 else 0)

# ringreduce: every rank evaluates its shard; the counts add up to the whole test set.
correct = np.sum(np.argmax(model.predict(test_x, verbose=0), axis=1) == test_y)
counts = rr.allreduce(np.array([correct, len(test_y)], dtype=np.float64), op=rr.Sum, name="test_counts")
accuracy = 100.0 * float(counts[0]) / float(counts[1])
if rr.rank() == 0:
    print(f"test accuracy {accuracy:.1f}% on {int(counts[1])} images, {rr.size()} ranks")
