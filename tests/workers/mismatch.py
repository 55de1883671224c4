"""Rank 1 pushes 'weights' with another shape (or dtype); both ranks must be told."""

import sys

import tensorflow as tf

import tf_bps as bps

bps.init()
rank = bps.rank()
kind = sys.argv[1]
if kind == "shape":
    tensor = tf.zeros([2, 3]) if rank == 0 else tf.zeros([3, 2])
else:
    tensor = tf.zeros([4]) if rank == 0 else tf.zeros([4], tf.float64)
try:
    bps.push_pull(tensor, name="weights")
    print("NO ERROR", flush=True)
except tf.errors.OpError as error:
    print("ERROR " + error.message.replace("\n", " "), flush=True)
# The job survives a mismatch: the next agreeing push_pull works.
print("AFTER", bps.push_pull(tf.ones([2]), op=bps.Sum, name="after").numpy().tolist(), flush=True)
bps.shutdown()
