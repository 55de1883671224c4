"""ParameterServerStrategy: initial values, input sharding, evaluate and predict."""

import json

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = bps.ParameterServerStrategy()
rank = bps.rank()
report = {"rank": rank, "replicas": strategy.num_replicas_in_sync,
          "isinstance_mwms": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)}

# Initial values come from rank 0 although every rank seeds differently.
keras.utils.set_random_seed(100 + rank)
with strategy.scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
report["initial"] = [w.numpy().tolist() for w in model.weights]
keras.utils.set_random_seed(100)
plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
report["rank0_seed_initial"] = [w.numpy().tolist() for w in plain.weights]

# experimental_distribute_dataset: each worker sees its own shard of each global batch.
dataset = tf.data.Dataset.range(32).batch(8)
seen = []
for batch in strategy.experimental_distribute_dataset(dataset):
    for part in strategy.experimental_local_results(batch):
        seen.extend(int(v) for v in part.numpy())
report["seen"] = seen

# distribute_datasets_from_function: the InputContext describes this worker.
contexts = []


def dataset_fn(context):
    contexts.append([context.num_input_pipelines, context.input_pipeline_id,
                     context.num_replicas_in_sync, context.get_per_replica_batch_size(8)])
    return tf.data.Dataset.range(8).batch(context.get_per_replica_batch_size(8))


list(strategy.distribute_datasets_from_function(dataset_fn))
report["contexts"] = contexts

# evaluate and predict on a sharded dataset.
x = np.arange(48, dtype="float32").reshape(16, 3) / 48
y = np.ones((16, 2), "float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
report["evaluate"] = model.evaluate(data, verbose=0)
report["predict_rows"] = int(model.predict(data, verbose=0).shape[0])
report["reduce_sum"] = float(strategy.reduce(
    "SUM", strategy.run(lambda: tf.constant(1.0)), axis=None).numpy())
# DistributedOptimizer under the strategy would synchronise twice: refused.
with strategy.scope():
    doubled = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    doubled.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD()), loss="mse")
try:
    doubled.fit(data, epochs=1, verbose=0)
except ValueError as error:
    report["double_sync"] = str(error)
print("REPORT " + json.dumps(report), flush=True)
bps.shutdown()
