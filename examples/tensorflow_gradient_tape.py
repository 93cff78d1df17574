"""A custom TensorFlow training loop with DistributedGradientTape, data-parallel.

    rrun -np 2 python examples/tensorflow_gradient_tape.py

Logistic regression of scikit-learn's digits (is it a 0-4 or a 5-9?) in a tf.function, each
rank on its own shard. The changes from a single-process loop are marked "ringreduce".
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up notices off the log

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import ringreduce.tensorflow as rr  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=0.5)
args = parser.parse_args()

rr.init()  # ringreduce
digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)
y = (digits.target >= 5).astype(np.float32)[:, None]
x, y = x[rr.rank()::rr.size()], y[rr.rank()::rr.size()]  # ringreduce: this rank's shard

tf.random.set_seed(rr.rank())  # different on purpose: the broadcast below makes them equal
weights = tf.Variable(tf.random.normal([64, 1], stddev=0.1))
bias = tf.Variable(tf.zeros([1]))
rr.broadcast_variables([weights, bias], root_rank=0)  # ringreduce


@tf.function
def train_step(features, labels):
    with tf.GradientTape() as tape:
        logits = features @ weights + bias
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    tape = rr.DistributedGradientTape(tape)  # ringreduce: gradients averaged over ranks
    grad_w, grad_b = tape.gradient(loss, [weights, bias])
    weights.assign_sub(args.lr * grad_w)
    bias.assign_sub(args.lr * grad_b)
    return rr.allreduce(loss, name="loss")  # ringreduce: the mean loss over ranks


for step in range(args.steps):
    loss = train_step(x, y)
    if step % 50 == 0 and rr.rank() == 0:
        print(f"step {step:4d}  loss {float(loss):.4f}")

correct = tf.reduce_sum(tf.cast(tf.equal(tf.cast(x @ weights + bias > 0, tf.float32), y), tf.float64))
counts = rr.allreduce(tf.stack([correct, tf.constant(float(len(y)), tf.float64)]), op=rr.Sum, name="counts")
largest, smallest = rr.allreduce(weights, op=rr.Max, name="max"), rr.allreduce(weights, op=rr.Min, name="min")
identical = bool(tf.reduce_all(largest == smallest))
if rr.rank() == 0:
    print(f"training accuracy {100.0 * float(counts[0]) / float(counts[1]):.1f}% over {rr.size()} ranks; "
          f"weights identical on every rank: {identical}")
