"""Rank 1 pushes a tensor with another shape, or dtype, than rank 0's (each kind named
on the command line, in turn: 'weights', then 'values'); both ranks must be told, with
TensorFlow's OpError. Prints "ERROR <kind> <message>", then "AFTER <kind> <sum>"."""

import sys

import tensorflow as tf

import tf_bps as bps

bps.init()
rank = bps.rank()
for kind in sys.argv[1:]:
    if kind == "shape":
        tensor = tf.zeros([2, 3]) if rank == 0 else tf.zeros([3, 2])
    else:
        tensor = tf.zeros([4]) if rank == 0 else tf.zeros([4], tf.float64)
    try:
        bps.push_pull(tensor, name="weights" if kind == "shape" else "values")
        print(f"NO ERROR {kind}", flush=True)
    except tf.errors.OpError as error:
        print(f"ERROR {kind} " + error.message.replace("\n", " "), flush=True)
    # The job survives a mismatch: the next agreeing push_pull works.
    after = bps.push_pull(tf.ones([2]), op=bps.Sum, name=f"after_{kind}")
    print(f"AFTER {kind}", after.numpy().tolist(), flush=True)
bps.shutdown()
