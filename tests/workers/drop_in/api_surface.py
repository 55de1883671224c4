"""What Horovod/BytePS scripts rely on beyond the examples; prints one REPORT per rank.

Checked here, each in the way scripts use it: communicating ops with constant inputs in
tf.function (never folded or merged), jit_compile, the module surfaces, allreduce's
arguments, DistributedOptimizer / DistributedGradientTape keyword arguments (honoured
or refused by name), load_model, local placement and logging.
"""

import json
import logging
import os
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps
import tf_bps.keras as bps_keras

logging.basicConfig(level=logging.INFO, format="USERLOG %(name)s %(message)s")
bps.init()
rank, size = bps.rank(), bps.size()
report = {"rank": rank, "size": size, "local_rank": bps.local_rank(),
          "local_size": bps.local_size(), "cross_rank": bps.cross_rank(),
          "cross_size": bps.cross_size()}

# Logging: the root logger is still the user's.
logging.getLogger("user").info("configured by the script")
report["root_handlers"] = len(logging.getLogger().handlers)
report["tf_bps_propagates"] = logging.getLogger("tf_bps").propagate


# 1. Constant inputs inside tf.function: a non-root rank's broadcast input is a constant.
@tf.function
def broadcast_constants():
    return bps.broadcast(tf.constant([10, 20, 30]) * (rank + 1), root_rank=0, name="bc")


@tf.function
def twin_push_pulls():
    # Two identical calls on the same constant must both run (and not be merged).
    one = bps.push_pull(tf.constant([1.0, 2.0]), op=bps.Sum, name="twin.a")
    two = bps.push_pull(tf.constant([1.0, 2.0]), op=bps.Sum, name="twin.b")
    return one, two


report["broadcast_constant"] = broadcast_constants().numpy().tolist()
report["twins"] = [t.numpy().tolist() for t in twin_push_pulls()]

try:
    tf.function(lambda: bps.push_pull(tf.ones([3]), name="xla"), jit_compile=True)()
    report["jit"] = "ran"
except tf.errors.OpError as error:
    report["jit"] = error.message.splitlines()[0]

# 2. Module surfaces.
names = ["init", "shutdown", "rank", "size", "local_rank", "local_size", "push_pull",
         "allreduce", "broadcast", "broadcast_variables", "allgather", "DistributedOptimizer",
         "DistributedGradientTape", "callbacks", "load_model", "Compression", "Average", "Sum",
         "global_process_set", "sycl_built", "cuda_built", "nccl_built", "cross_rank"]
report["missing"] = [f"{module.__name__}.{name}" for module in (bps, bps_keras)
                     for name in names if not hasattr(module, name)]

# 3. allreduce as Horovod defines it.
value = tf.constant([float(rank + 1)] * 4)
report["allreduce_default"] = bps.allreduce(value).numpy().tolist()
report["allreduce_sum"] = bps.allreduce(value, op=bps.Sum).numpy().tolist()
report["allreduce_scaled"] = bps_keras.allreduce(
    value, op=bps.Sum, prescale_factor=2.0, postscale_factor=0.5, name="scaled").numpy().tolist()
report["allreduce_average_false"] = bps.allreduce(value, average=False,
                                                  name="avgfalse").numpy().tolist()
report["allreduce_global_set"] = bps.allreduce(
    value, process_set=bps.global_process_set, device_dense="/cpu:0",
    name="globalset").numpy().tolist()
sparse = tf.IndexedSlices(tf.constant([[float(rank)]]), tf.constant([rank], tf.int64),
                          dense_shape=tf.constant([size, 1], tf.int64))
gathered = bps.allreduce(sparse, name="sparse")
report["allreduce_sparse"] = [gathered.values.numpy().ravel().tolist(),
                              gathered.indices.numpy().tolist()]


def refusal(function, *args, **kwargs):
    try:
        function(*args, **kwargs)
    except (ValueError, NotImplementedError) as error:
        return str(error)
    return None


report["refusals"] = {
    "allreduce process_set": refusal(bps.allreduce, value, process_set=bps.ProcessSet([0])),
    "allreduce op": refusal(bps.allreduce, value, op=bps.Adasum),
    "optimizer op": refusal(bps.DistributedOptimizer, keras.optimizers.SGD(), op=7),
    "optimizer num_groups": refusal(bps.DistributedOptimizer, keras.optimizers.SGD(),
                                    num_groups=-1),
    "optimizer groups": refusal(bps.DistributedOptimizer, keras.optimizers.SGD(), groups="x"),
    "optimizer process_set": refusal(bps.DistributedOptimizer, keras.optimizers.SGD(),
                                     process_set=bps.ProcessSet([1])),
    "optimizer use_locking": refusal(bps.DistributedOptimizer, keras.optimizers.SGD(),
                                     use_locking=True),
    "optimizer predivide with sum": refusal(bps.DistributedOptimizer, keras.optimizers.SGD(),
                                            op=bps.Sum, gradient_predivide_factor=2.0),
    "tape process_set": refusal(bps.DistributedGradientTape, tf.GradientTape(),
                                process_set=bps.ProcessSet([0])),
    "tape scale_local_gradients": refusal(bps.DistributedGradientTape, tf.GradientTape(),
                                          scale_local_gradients="yes"),
}


# 4. DistributedOptimizer keyword arguments that change results. Each rank offers the
# gradient rank + 1 to SGD(1.0), so the average is (size + 1) / 2.
def applied(optimizer, passes=1, local=False):
    variable = keras.Variable(np.zeros(2, "float32"))
    if local:
        optimizer.register_local_var(variable)
    for _ in range(passes):
        optimizer.apply_gradients([(tf.fill([2], float(rank + 1)), variable)])
    return variable.numpy().tolist()


every_argument = dict(name="everything", device_dense="", device_sparse="",
                      compression=bps.Compression.none, sparse_as_dense=True,
                      backward_passes_per_step=1, op=bps.Average, gradient_predivide_factor=4.0,
                      average_aggregated_gradients=False, num_groups=2, groups=None,
                      process_set=bps.global_process_set, scale_local_gradients=True)
report["optimizer_every_argument"] = applied(
    bps.DistributedOptimizer(keras.optimizers.SGD(1.0), **every_argument))
report["optimizer_passes_sum"] = applied(
    bps.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2), passes=2)
report["optimizer_passes_mean"] = applied(
    bps.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2,
                             average_aggregated_gradients=True), passes=2)
report["optimizer_local_var"] = applied(bps.DistributedOptimizer(keras.optimizers.SGD(1.0)),
                                        local=True)
report["optimizer_local_unscaled"] = applied(
    bps.DistributedOptimizer(keras.optimizers.SGD(1.0), scale_local_gradients=False), local=True)

source = tf.Variable([1.0, 1.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(source * float(rank + 1))
tape = bps.DistributedGradientTape(tape, device_dense="", device_sparse="",
                                   compression=bps.Compression.fp16, sparse_as_dense=False,
                                   op=bps.Sum, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=bps.global_process_set,
                                   scale_local_gradients=True)
report["tape_every_argument"] = tape.gradient(loss, [source])[0].numpy().tolist()
# A local embedding (model parallel): its sparse gradient stays sparse, scaled by 1/size.
table = tf.Variable(tf.ones([3, 2]))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.gather(table, [rank]) * float(rank + 1))
tape = bps.DistributedGradientTape(tape)
tape.register_local_source(table)
grad = tape.gradient(loss, table)
report["tape_local_sparse"] = [type(grad).__name__, grad.values.numpy().tolist()]

# 5. load_model: the optimizer comes back distributed, with its state.
keras.utils.set_random_seed(0)  # The same model everywhere: updates compare exactly.
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
model.fit(np.ones((4, 2), "float32"), np.ones((4, 1), "float32"), epochs=1, verbose=0)
path = os.path.join(tempfile.mkdtemp(), "model.keras")
model.save(path)
loaded = bps_keras.load_model(path)
report["loaded_class"] = [type(loaded.optimizer).__name__,
                          type(loaded.optimizer).__mro__[1].__name__]
report["loaded_iterations"] = int(loaded.optimizer.iterations.numpy())
before = [w.numpy().copy() for w in loaded.trainable_weights]
loaded.fit(np.ones((4, 2), "float32") * (rank + 1), np.ones((4, 1), "float32"), epochs=1,
           verbose=0)
report["loaded_weights"] = [float(np.sum(w.numpy() - b))
                            for w, b in zip(loaded.trainable_weights, before, strict=True)]

print("REPORT " + json.dumps(report), flush=True)
bps.shutdown()
sys.exit(0)
