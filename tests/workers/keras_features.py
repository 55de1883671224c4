"""DistributedOptimizer details, callbacks, sparse gradients and saving; prints a REPORT."""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

bps.init()
rank, size = bps.rank(), bps.size()
report = {"rank": rank}

# 1. Only synchronised gradients are applied: each rank offers its own gradient.
variable = keras.Variable(np.zeros(3, "float32"), name="probe")
plain = keras.optimizers.SGD(1.0)
optimizer = bps.DistributedOptimizer(plain)
optimizer.apply_gradients([(tf.fill([3], float(rank + 1)), variable)])
report["applied"] = variable.numpy().tolist()
report["class"] = [type(optimizer).__name__, type(optimizer).__module__]
report["config_matches"] = optimizer.get_config() == plain.get_config()

# 2. model.fit with the callbacks; workers start from different weights.
keras.utils.set_random_seed(rank)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5)),
              loss="mse", metrics=["mae"])
rng = np.random.default_rng(rank)
x = rng.normal(size=(32, 4)).astype("float32")
y = rng.normal(size=(32, 1)).astype("float32") * (rank + 1)


class RecordRates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rates = []
        self.first_weights = None

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))
        if self.first_weights is None:
            self.first_weights = [w.numpy().tolist() for w in self.model.weights]


class RecordLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


report["initial_weights"] = [w.numpy().tolist() for w in model.weights]
record, local_logs, averaged_logs = RecordRates(), RecordLogs(), RecordLogs()
callbacks = [
    bps.callbacks.BroadcastGlobalVariablesCallback(0),
    local_logs,
    bps.callbacks.MetricAverageCallback(),
    averaged_logs,
    bps.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2),
    record,
]
model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=callbacks)
report["rates"] = record.rates
report["first_weights"] = record.first_weights
report["local_logs"] = local_logs.logs
report["averaged_logs"] = averaged_logs.logs
report["final_weights"] = [w.numpy().tolist() for w in model.weights]

# 3. A staircase schedule: the rate at each epoch start.
schedule = bps.callbacks.LearningRateScheduleCallback(
    initial_lr=0.1, multiplier=lambda epoch: 0.5 ** epoch, start_epoch=1, end_epoch=3)
record_schedule = RecordRates()
model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[schedule, record_schedule])
report["schedule_rates"] = record_schedule.rates

# Momentum correction: a change of rate rescales SGD's momentum buffers by new / old.
corrected = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
corrected.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
corrected.optimizer.build(corrected.trainable_variables)
corrected.optimizer.momentums[0].assign([[1.0], [-2.0]])
halve = bps.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5)
halve.set_model(corrected)
halve.on_epoch_begin(0)
report["momentum_corrected"] = corrected.optimizer.momentums[0].numpy().ravel().tolist()

# 4. Sparse gradients (an embedding lookup), kept sparse or densified.
table = tf.Variable(tf.zeros([6, 2]))
for sparse_as_dense in (False, True):
    with tf.GradientTape() as tape:
        rows = tf.gather(table, [rank, rank + 2, 5])
        loss = tf.reduce_sum(rows) * (rank + 1)
    grad = bps.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense).gradient(loss, table)
    report[f"sparse_{sparse_as_dense}"] = [type(grad).__name__,
                                           tf.convert_to_tensor(grad).numpy().tolist()]

# 5. allgather with a different first dimension per rank.
report["allgather"] = bps.allgather(tf.fill([rank + 1, 2], rank), name="rows").numpy().tolist()

# 6. A legacy tf.compat.v1 optimizer in graph code.
graph = tf.Graph()
with graph.as_default():
    weight = tf.compat.v1.get_variable("w", initializer=tf.zeros([2]), use_resource=True)
    legacy = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
    train_op = legacy.minimize(tf.reduce_sum(weight) * float(rank + 1), var_list=[weight])
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(train_op)
        report["legacy"] = session.run(weight).tolist()

# 7. Save from rank 0 for a plain Keras process to load.
report["saved_weights"] = [w.numpy().tolist() for w in model.weights]
if rank == 0:
    model.save(os.path.join(sys.argv[1], "model.keras"))
print("REPORT " + json.dumps(report), flush=True)
bps.shutdown()
