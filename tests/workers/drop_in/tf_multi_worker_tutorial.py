"""TensorFlow's "multi-worker training with Keras" tutorial, with its strategy replaced by
tf_bps.ParameterServerStrategy(): TF_CONFIG gives the worker count, the global batch is
per-worker x workers, fit under the scope; then the chief/non-chief saving recipe with
strategy.cluster_resolver (model.save and a CheckpointManager to temporary directories on
non-chief workers), every worker loading the chief's model and checkpoint right after, a
restore, and BackupAndRestore shared by all workers. With SAVE_ROUNDS=N the save-then-load
steps run N times more with the chief's writes slowed down, each time with new weights."""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf
from common import report, synthetic_mnist

import tf_bps

out = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5


def mnist_dataset(batch_size):
    x_train, y_train = synthetic_mnist(seed=0)
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    return tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(512).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
                  metrics=["accuracy"])
    return model


tf_config = json.loads(os.environ["TF_CONFIG"]) if "TF_CONFIG" in os.environ else None
num_workers = len(tf_config["cluster"]["worker"]) if tf_config else 1
strategy = tf_bps.ParameterServerStrategy()
global_batch_size = 32 * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()
multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=steps)


def _is_chief(task_type, task_id):
    return task_type == "worker" and task_id == 0 or task_type is None


def _get_temp_dir(dirpath, task_id):
    temp_dir = os.path.join(os.path.dirname(dirpath), "workertemp_" + str(task_id))
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    base = os.path.basename(filepath)
    dirpath = os.path.dirname(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


task_type, task_id = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)
model_path = os.path.join(out, "keras-model.keras")
write_model_path = write_filepath(model_path, task_type, task_id)
checkpoint_dir = os.path.join(out, "ckpt")
checkpoint = tf.train.Checkpoint(model=multi_worker_model)
write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir,
                                                max_to_keep=1)
bias = multi_worker_model.layers[-1].bias


def save_then_load(mark):
    """The tutorial's saving recipe, then what each worker reads back: the chief's files
    must hold the weights of this round (`mark` in the last bias)."""
    bias.assign(tf.fill(bias.shape, float(mark)))
    multi_worker_model.save(write_model_path)
    if not _is_chief(task_type, task_id):
        tf.io.gfile.rmtree(os.path.dirname(write_model_path))
    loaded_model = tf.keras.models.load_model(model_path)
    assert float(loaded_model.layers[-1].bias[0]) == mark, (mark, "model")

    checkpoint_manager.save()
    if not _is_chief(task_type, task_id):
        tf.io.gfile.rmtree(write_checkpoint_dir)
    bias.assign(tf.zeros_like(bias))
    latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
    checkpoint.restore(latest_checkpoint)
    assert float(bias[0]) == mark, (mark, "checkpoint", latest_checkpoint)


save_then_load(1)
save_rounds = int(os.environ.get("SAVE_ROUNDS", "0"))
if save_rounds and _is_chief(task_type, task_id):
    # The chief writes late, as a slow disk would have it: each write waits first.
    from keras.src.saving import saving_lib

    def slowly(write):
        def slow_write(*args, **kwargs):
            time.sleep(0.1)
            return write(*args, **kwargs)
        return slow_write

    saving_lib.save_model = slowly(saving_lib.save_model)
    checkpoint._write = slowly(checkpoint._write)
for mark in range(2, 2 + save_rounds):
    save_then_load(mark)
multi_worker_model.fit(multi_worker_dataset, epochs=1, steps_per_epoch=steps)

# Every worker passes the same backup_dir, as the tutorial does; a spy on Keras's own
# weight writer counts who actually writes there.
from keras.src.saving import saving_lib  # noqa: E402

writes = []
write_weights = saving_lib.save_weights_only


def counting_save_weights(model, filepath, *args, **kwargs):
    writes.append(str(filepath))
    return write_weights(model, filepath, *args, **kwargs)


saving_lib.save_weights_only = counting_save_weights
callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(out, "backup"),
                                                 delete_checkpoint=False),
             tf.keras.callbacks.ModelCheckpoint(os.path.join(out, "best.weights.h5"),
                                                save_weights_only=True),
             tf.keras.callbacks.TensorBoard(log_dir=os.path.join(out, "logs"))]
multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=steps,
                       callbacks=callbacks)
report(tf_bps.rank(), multi_worker_model.trainable_variables, task_type=task_type,
       task_id=task_id, writes=len(writes),
       cluster=strategy.cluster_resolver.cluster_spec().as_dict(),
       should_checkpoint=strategy.extended.should_checkpoint,
       should_save_summary=strategy.extended.should_save_summary,
       chief_model_saved=os.path.exists(model_path))
