"""A Keras elastic job: a small model fit for 4 epochs of 5 steps with KerasState and the elastic
callbacks (a commit at each epoch's end); in generation 0, rank 1 exits as epoch 2 begins. Rank 0
prints the weights' sum and the optimizer's iterations at each commit and where each generation
resumed, and every rank its final weights' sum."""

import json
import os

import keras
import numpy as np

import ringreduce.tensorflow.keras as rr

rr.init()
generation = int(os.environ.get("RINGREDUCE_ELASTIC_GENERATION", "0"))
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=rr.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
rng = np.random.default_rng(rr.rank())
x = rng.standard_normal((40, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
state = rr.elastic.KerasState(model, epoch=0, batch=0)


def report(kind):
    if rr.rank() == 0:
        print(f"{kind} " + json.dumps({"epoch": state.epoch, "sum": float(sum(w.sum() for w in model.get_weights())),
                                       "iterations": int(model.optimizer.iterations.numpy())}), flush=True)


class Fail(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if generation == 0 and epoch == 2 and rr.rank() == 1:
            os._exit(3)


class Report(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        report("COMMITTED")


@rr.elastic.run
def train(state):
    report("RESUMED")
    model.fit(x, y, batch_size=8, epochs=4, initial_epoch=state.epoch, shuffle=False, verbose=0,
              callbacks=[Fail(), rr.elastic.CommitStateCallback(state), rr.elastic.UpdateBatchStateCallback(state),
                         rr.elastic.UpdateEpochStateCallback(state), Report()])


train(state)
print("FINAL " + json.dumps({"sum": float(sum(w.sum() for w in model.get_weights()))}), flush=True)
