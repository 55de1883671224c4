"""A custom training loop with bps.DistributedGradientTape.

    bpslaunch -np 2 python examples/custom_loop_gradient_tape.py
    python examples/custom_loop_gradient_tape.py                  # one process
"""

import argparse

import digits_data
import keras
import tensorflow as tf

import tf_bps as bps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    args = parser.parse_args()

    bps.init()
    (x_train, y_train), (x_test, y_test), data = digits_data.load()
    if bps.rank() == 0:
        print(f"{bps.size()} worker(s), {data}")
    dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
               .shard(bps.size(), bps.rank()).repeat().shuffle(1000, seed=bps.rank())
               .batch(args.batch_size))

    model = keras.Sequential([keras.Input(x_train.shape[1:]), keras.layers.Flatten(),
                              keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = bps.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    # Same starting point everywhere: rank 0's weights.
    bps.broadcast_variables(model.variables, root_rank=0)
    for step, (images, labels) in enumerate(dataset.take(args.steps)):
        loss = train_step(images, labels)
        if step == 0:
            # The optimizer's state exists after its first step; make it equal too.
            bps.broadcast_variables(optimizer.variables, root_rank=0)
        if step % 50 == 0 or step == args.steps - 1:
            mean_loss = bps.push_pull(loss, name="loss").numpy()
            if bps.rank() == 0:
                print(f"step {step}: loss {mean_loss:.4f}")
    # Every worker scores the same held-out images; the average is the job's.
    predicted = tf.argmax(model(x_test, training=False), axis=1)
    accuracy = tf.reduce_mean(tf.cast(predicted == y_test, tf.float32))
    accuracy = bps.push_pull(accuracy, name="held_out_accuracy").numpy()
    if bps.rank() == 0:
        print(f"held-out accuracy {accuracy:.4f}")
    bps.shutdown()


if __name__ == "__main__":
    main()
