"""MNIST for the examples: the real data set when Keras has it cached, else synthetic
images of the same shape whose labels the model can learn."""

import os

import numpy as np


def load(num_train=6000, num_test=1000, seed=0):
    """Returns (x_train, y_train), (x_test, y_test), source; images are float32 in [0, 1]."""
    cached = os.path.expanduser("~/.keras/datasets/mnist.npz")
    if os.path.exists(cached):
        import keras

        (x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
        scale = np.float32(1 / 255)
        return ((x_train[:num_train, ..., None] * scale, y_train[:num_train]),
                (x_test[:num_test, ..., None] * scale, y_test[:num_test]), "mnist")
    rng = np.random.default_rng(seed)

    def make(count):
        # The label is the 28x28 image's brightest band of rows (10 bands).
        images = rng.uniform(0, 1, size=(count, 28, 28, 1)).astype("float32")
        labels = rng.integers(0, 10, size=count)
        for band in range(10):
            rows = slice(band * 28 // 10, (band + 1) * 28 // 10 + 1)
            images[labels == band, rows] += 0.3
        return np.clip(images, 0, 1), labels.astype("int64")

    return make(num_train), make(num_test), "synthetic"


def describe(source: str) -> str:
    if source == "mnist":
        return "MNIST from the Keras cache"
    return "synthetic MNIST-shaped data (no cached MNIST in ~/.keras/datasets)"
