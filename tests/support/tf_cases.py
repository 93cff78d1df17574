"""What the TensorFlow tests train: one model, one data set, the same on every rank."""

import numpy as np

STEPS = 5
BATCH = 16  # global: each of n ranks takes a contiguous BATCH / n rows of every batch
FEATURES, CLASSES = 12, 4


def data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(STEPS * BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=STEPS * BATCH)
    return x, y


def shard(array, rank, size):
    """This rank's rows of every batch, in batch order: what it trains on."""
    per_rank = BATCH // size
    batches = array.reshape(STEPS, BATCH, *array.shape[1:])
    return batches[:, rank * per_rank:(rank + 1) * per_rank].reshape(-1, *array.shape[1:])


def model(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(CLASSES)])


def topk_input(rank):
    """A 2 x 4 tensor whose two largest magnitudes differ by rank (one of them negative)."""
    values = np.arange(1, 9, dtype=np.float32).reshape(2, 4) / 10
    values[rank % 2, rank % 4] = -5.0 - rank
    values[1 - rank % 2, 3] = 4.0
    return values
