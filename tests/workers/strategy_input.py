"""ParameterServerStrategy's input on a worker with one CPU replica, in one process
without a job: which iterator TensorFlow reads it through, and what each step gets.
Prints REPORT {...}."""

import json

import tensorflow as tf

import tf_bps as bps

bps.init()
strategy = bps.ParameterServerStrategy()
dataset = tf.data.Dataset.range(12).batch(4)
iterator = iter(strategy.experimental_distribute_dataset(dataset))
readers = [type(worker._iterator).__name__ for worker in iterator._iterators]
steps = [strategy.experimental_local_results(next(iterator))[0].numpy().tolist()
         for _ in range(3)]
print("REPORT " + json.dumps({"rank": bps.rank(), "readers": readers, "steps": steps}),
      flush=True)
