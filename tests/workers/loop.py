"""push_pulls forever (until something fails); prints the error it gets."""

import sys
import time

import tensorflow as tf

import tf_bps as bps

bps.init()
rank = bps.rank()
only_rank = int(sys.argv[1]) if len(sys.argv) > 1 else -1
x = tf.ones([100_000])
print("READY", flush=True)
step = 0
try:
    while True:
        if only_rank in (-1, rank):
            bps.push_pull(x, name=f"loop{step % 4}")
        step += 1
        time.sleep(0.01)
except tf.errors.OpError as error:
    print("ERROR " + error.message.replace("\n", " "), flush=True)
    sys.exit(3)
