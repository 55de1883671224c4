"""One worker: push_pull needs no scheduler or server."""

import json

import tensorflow as tf

import tf_bps as bps

bps.init()
x = tf.constant([1.0, 2.0, 3.0])
report = {
    "rank": bps.rank(), "size": bps.size(), "local_rank": bps.local_rank(),
    "local_size": bps.local_size(),
    "sum": bps.push_pull(x, op=bps.Sum).numpy().tolist(),
    "avg": bps.push_pull(x, average=True, name="a").numpy().tolist(),
    "bcast": bps.broadcast(tf.constant([4, 5]), 0).numpy().tolist(),
    "int_avg": bps.push_pull(tf.constant([7, -7]), name="i").numpy().tolist(),
}
print("REPORT " + json.dumps(report), flush=True)
bps.shutdown()
