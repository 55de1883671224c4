"""broadcast, broadcast_variables and the gradient of push_pull; prints JSON lines."""

import json

import tensorflow as tf

import tf_bps as bps

bps.init()
rank, size = bps.rank(), bps.size()
report = {"rank": rank, "size": size}

root_value = bps.broadcast(tf.constant([rank + 1.5, -rank], tf.float64), root_rank=1)
report["broadcast"] = root_value.numpy().tolist()
report["broadcast_bool"] = bps.broadcast(tf.constant([rank == 0, True]), 0).numpy().tolist()

variables = [tf.Variable(tf.fill([3], float(rank * 10))), tf.Variable(rank + 7)]
bps.broadcast_variables(variables, root_rank=0)
report["variables"] = [v.numpy().tolist() for v in variables]

# loss_r = sum(push_pull_sum(v) * (r + 1)); d loss_r / d v = sum over ranks of (r + 1).
v = tf.Variable([1.0, 2.0, 3.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(bps.push_pull(v, op=bps.Sum, name="grad_sum") * (rank + 1))
report["grad_sum"] = tape.gradient(loss, v).numpy().tolist()


@tf.function
def averaged_grad():
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(bps.push_pull(v * 2.0, average=True) * (rank + 1))
    return tape.gradient(loss, v)


report["grad_average_fn"] = averaged_grad().numpy().tolist()

try:
    bps.broadcast(tf.constant(1.0), root_rank=size)
except ValueError as error:
    report["bad_root"] = str(error)

print("REPORT " + json.dumps(report), flush=True)
bps.shutdown()
