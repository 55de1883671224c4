"""Keras's gradient_accumulation_steps under ParameterServerStrategy, with model.fit: each
worker adds up ACCUMULATE passes of its share of every global batch, and the job applies
their mean once. Afterwards this process trains the same model alone, without the
strategy, on batches ACCUMULATE times the job's global batch: the weights must agree.

Prints REPORT {rank, weights, reference, initial_distance, iterations,
reference_iterations, passes, accumulate, passes_counted, gradient_bytes}."""

import json

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

FEATURES, BATCH, ACCUMULATE, UPDATES = 4, 8, 3, 3  # BATCH: per worker and pass


def build():
    keras.utils.set_random_seed(1234)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def data(workers: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(UPDATES * ACCUMULATE * workers * BATCH, FEATURES)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None] + 0.1
    return tf.data.Dataset.from_tensor_slices((x, y))


def trained(model, optimizer, dataset) -> list[list]:
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(dataset, epochs=1, verbose=0)
    return [w.numpy().tolist() for w in model.weights]


def main():
    strategy = bps.ParameterServerStrategy()
    workers = bps.size()
    # The strategy gives each worker its share of every global batch of workers * BATCH.
    with strategy.scope():
        model = build()
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9,
                                         gradient_accumulation_steps=ACCUMULATE)
        weights = trained(model, optimizer, data(workers).batch(workers * BATCH))
    reference_model = build()
    reference = keras.optimizers.SGD(0.05, momentum=0.9)
    reference_weights = trained(reference_model, reference,
                                data(workers).batch(ACCUMULATE * workers * BATCH))
    print("REPORT " + json.dumps({
        "rank": bps.rank(), "weights": weights, "reference": reference_weights,
        "iterations": int(optimizer.iterations.numpy()),
        "reference_iterations": int(reference.iterations.numpy()),
        "passes": UPDATES * ACCUMULATE, "accumulate": ACCUMULATE,
        # Keras's own count of passes, which its learning-rate schedules read.
        "passes_counted": int(next(v for v in optimizer.variables
                                   if v.name == "iteration").numpy()),
        "gradient_bytes": sum(4 * int(np.prod(w.shape)) for w in model.trainable_weights),
        "initial_distance": max(float(np.abs(np.array(after) - before.numpy()).max())
                                for after, before in zip(weights, build().weights, strict=True))}),
        flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
