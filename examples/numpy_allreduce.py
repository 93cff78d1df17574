"""Data-parallel training with plain numpy: linear regression by SGD on every rank.

    rrun -np 2 python examples/numpy_allreduce.py

Each rank holds its own shard of the data. Every step, each rank computes the gradient on
its shard and `allreduce` averages the gradients over all ranks, so every rank applies the
same update and the model stays identical everywhere: one model, trained on all the data.
"""

import numpy as np

import ringreduce as rr

rr.init()
rank, size = rr.rank(), rr.size()

# The data: y = X @ true_w + noise. Each rank draws a different shard of it.
features, samples_per_rank = 8, 4096
true_w = np.linspace(-2.0, 2.0, features)
rng = np.random.default_rng(seed=rank)
X = rng.standard_normal((samples_per_rank, features))
y = X @ true_w + 0.01 * rng.standard_normal(samples_per_rank)

# Start every rank from the same weights: rank 0's random guess, broadcast to the others.
w = rr.broadcast(np.random.default_rng(seed=1234 + rank).standard_normal(features), root_rank=0)

learning_rate = 0.1
for step in range(60):
    residual = X @ w - y
    local_gradient = 2.0 * X.T @ residual / samples_per_rank
    gradient = rr.allreduce(local_gradient, op=rr.Average, name="gradient")
    w -= learning_rate * gradient
    if step % 10 == 0:
        loss = rr.allreduce(np.array([np.mean(residual**2)]), name="loss")[0]
        if rank == 0:
            print(f"step {step:3d}  mean squared error over all {size} shards: {loss:.6f}")

# Every rank must hold bit-for-bit the same model; allgather_object collects them to check.
models = rr.allgather_object(w.tobytes())
assert all(m == models[0] for m in models), "the ranks' models diverged"
error = np.max(np.abs(w - true_w))
if rank == 0:
    print(f"trained on {size * samples_per_rank} samples by {size} ranks; "
          f"largest weight error {error:.4f}; models identical on all ranks")
assert error < 0.01
