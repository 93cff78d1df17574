"""ringreduce.tensorflow on process sets at 3 ranks: set [0, 1] and set [2]. Eager and tf.function
collectives, broadcast_variables and DistributedGradientTape on a set. Usage: tf_sets.py OUT_DIR"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import ringreduce.tensorflow as rr  # noqa: E402

rr.init()
rank = rr.rank()
pair, alone = rr.add_process_set([0, 1]), rr.add_process_set([2])
group = pair if pair.included() else alone
x = tf.constant([1.0, 2.0, 3.0]) * (rank + 1)


@tf.function
def in_graph(value):
    return rr.allgather(tf.reshape(value, [1, 3]), process_set=group)


variable = tf.Variable(tf.fill([2], float(rank)))
rr.broadcast_variables([variable], root_rank=group.ranks[-1], process_set=group)
w = tf.Variable([1.0, -1.0, 0.5])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(w * x)
tape = rr.DistributedGradientTape(tape, process_set=group)
report = {
    "sum": rr.allreduce(x, op=rr.Sum, process_set=group).numpy().tolist(),
    "gathered": in_graph(x).numpy().tolist(),
    "variable": variable.numpy().tolist(),
    "gradient": tape.gradient(loss, [w])[0].numpy().tolist(),
    "size_op": int(rr.size_op(process_set_id=group.process_set_id)),
}
if rank == 0:
    rr.send(tf.constant([[1, 2], [3, 4]], dtype=tf.int64), 1, process_set=pair, tag=2)
elif rank == 1:
    into = tf.Variable(tf.zeros([2, 2], dtype=tf.int64))
    report["recv-from"] = rr.recv(into, 0, process_set=pair, tag=2)
    report["recv"] = into.numpy().tolist()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(report, f)
