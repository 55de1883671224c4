"""Trains a counter inside elastic.run, committing every 5 steps, until a collective
breaks; prints a REPORT of the error run ends with and the state it restored."""

import json
import sys
import time

import tensorflow as tf

import tf_bps as bps
import tf_bps.elastic as elastic

bps.init()
counter = tf.Variable(0.0)
state = elastic.TensorFlowState([counter], step=0)
print("READY", flush=True)


@elastic.run
def train(state):
    while True:
        bps.push_pull(tf.ones([10_000]), name="elastic_loop")
        counter.assign_add(1.0)
        state.step += 1
        if state.step % 5 == 0:
            state.commit()
        time.sleep(0.01)


try:
    train(state)
except elastic.HorovodInternalError as error:
    print("REPORT " + json.dumps({
        "rank": bps.rank(), "error": str(error).replace("\n", " "),
        "cause": type(error.__cause__).__name__, "step": state.step,
        "counter": float(counter.numpy())}), flush=True)
    sys.exit(3)
