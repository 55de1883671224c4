"""A Horovod elastic script with its import lines switched: the state semantics of
Horovod's test_elastic_state (sync, restore, commit) for TensorFlow variables and a
Keras model, the agreement on host updates, and model.fit inside `elastic.run` with the
elastic callbacks. Prints a REPORT."""

import json
import time

import keras
import numpy as np
import tensorflow as tf

import tf_bps.elastic as elastic
import tf_bps.keras as hvd

hvd.init()
rank = hvd.rank()
report = {"rank": rank}
value = 1.0 if rank == 0 else 2.0


def snapshot(state, variables):
    return {"values": [v.numpy().tolist() for v in variables], "batch": state.batch,
            "epoch": state.epoch}


# 1. TensorFlow variables: every worker starts from its own values and attributes.
variables = [tf.Variable(np.full((2, 2), value, "float32")),
             tf.Variable(np.full(2, value, "float32"))]
state = elastic.TensorFlowState(variables, batch=20 + rank, epoch=10 + rank)
state.sync()
report["tf_synced"] = snapshot(state, variables)
variables[0].assign([[1.0, 2.0], [3.0, 4.0]])
variables[1].assign([0.0, 0.0])
state.batch, state.epoch = 21, 11
state.restore()
report["tf_restored"] = snapshot(state, variables)
variables[0].assign([[1.0, 2.0], [3.0, 4.0]])
variables[1].assign([0.0, 0.0])
state.batch, state.epoch = 21, 11
state.commit()
state.restore()
report["tf_committed"] = snapshot(state, variables)

# 2. A Keras model and its optimizer, the same way.
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
model.set_weights([np.full((2, 2), value, "float32"), np.full(2, value, "float32")])
optimizer = keras.optimizers.Adam(0.001 * hvd.size())
keras_state = hvd.elastic.KerasState(model, optimizer, batch=20 + rank, epoch=10 + rank)
keras_state.sync()
weights = lambda: [w.tolist() for w in model.get_weights()]  # noqa: E731
report["keras_synced"] = [weights(), keras_state.batch, keras_state.epoch]
changed = [np.array([[1.0, 2.0], [3.0, 4.0]], "float32"), np.zeros(2, "float32")]
model.set_weights(changed)
keras_state.batch, keras_state.epoch = 21, 11
keras_state.restore()
report["keras_restored"] = [weights(), keras_state.batch, keras_state.epoch]
model.set_weights(changed)
keras_state.batch, keras_state.epoch = 21, 11
keras_state.commit()
keras_state.restore()
report["keras_committed"] = [weights(), keras_state.batch, keras_state.epoch]

# 3. A change of hosts that only rank 0 heard of stops every worker at the same commit.
interrupts = []
for heard in (elastic.HostUpdateResult.removed, elastic.HostUpdateResult.added, None):
    if rank == 0 and heard is not None:
        keras_state.on_hosts_updated(time.time(), heard)
    try:
        keras_state.commit()
        interrupts.append("none")
    except elastic.HostsUpdatedInterrupt as interrupt:
        interrupts.append("skip_sync" if interrupt.skip_sync else "sync")
report["interrupts"] = interrupts

# 4. model.fit inside elastic.run, with the callbacks of Horovod's Keras elastic example.
keras.utils.set_random_seed(rank)
net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
rng = np.random.default_rng(rank)
x = rng.normal(size=(32, 4)).astype("float32")
y = rng.normal(size=(32, 1)).astype("float32")
commits = []


class CountingCommit(hvd.elastic.CommitStateCallback):
    def commit(self):
        commits.append((train_state.epoch, train_state.batch))
        super().commit()


train_state = hvd.elastic.KerasState(net, batch=0, epoch=0)
resets = []
train_state.register_reset_callbacks([lambda: resets.append(1)])


@hvd.elastic.run
def train(state, epochs):
    state.model.fit(x, y, batch_size=8, epochs=epochs - state.epoch, verbose=0,
                    callbacks=[hvd.elastic.UpdateEpochStateCallback(state),
                               hvd.elastic.UpdateBatchStateCallback(state),
                               CountingCommit(state, batches_per_commit=2)])
    return "done"


report["run"] = train(train_state, 3)
report["fit_state"] = [train_state.epoch, train_state.batch]
report["commits"] = commits
report["resets"] = len(resets)
report["net_weights"] = [w.tolist() for w in net.get_weights()]

print("REPORT " + json.dumps(report), flush=True)
hvd.shutdown()
