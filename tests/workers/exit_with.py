"""Pushes once, then rank 1 exits with the status given (others wait a while)."""

import sys
import time

import tensorflow as tf

import tf_bps as bps

bps.init()
bps.push_pull(tf.ones([3]), name="once")
if bps.rank() == 1:
    sys.exit(int(sys.argv[1]))
time.sleep(60)
