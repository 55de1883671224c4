"""model.fit under tf_bps.ParameterServerStrategy.

    bpslaunch -np 2 python examples/keras_mnist_strategy.py
    python examples/keras_mnist_strategy.py                       # one process
"""

import argparse

import digits_data
import keras
import tensorflow as tf

import tf_bps as bps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128, help="global, over all replicas")
    args = parser.parse_args()

    keras.utils.set_random_seed(0)  # Reproducible runs: rank 0's initial weights reach all.
    strategy = bps.ParameterServerStrategy()
    (x_train, y_train), (x_test, y_test), data = digits_data.load()
    if bps.rank() == 0:
        print(f"{bps.size()} worker(s), {strategy.num_replicas_in_sync} replica(s), "
              f"{data}")
    # The strategy shards these data sets by worker and splits each global batch.
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(
        len(x_train), seed=0).batch(args.batch_size)
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)

    with strategy.scope():
        model = keras.Sequential([
            keras.Input(x_train.shape[1:]),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(2e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(train, epochs=args.epochs, shuffle=False,  # shuffled above
                        verbose=1 if bps.rank() == 0 else 0)
    loss, accuracy = model.evaluate(test, verbose=0)
    if bps.rank() == 0:
        print(f"final train loss {history.history['loss'][-1]:.4f}, "
              f"test loss {loss:.4f}, test accuracy {accuracy:.4f}")
    bps.shutdown()


if __name__ == "__main__":
    main()
