"""Real handwritten digits for the examples, offline: MNIST when Keras has it cached
(~/.keras/datasets/mnist.npz), else scikit-learn's digits (1,797 scanned 8x8 images of
the UCI data set, which the scikit-learn package ships): tools/bootstrap.sh puts that
file in examples/data/, and an installed scikit-learn serves as well. Either way a
fixed part is held out, and the accuracy the examples print is measured on it.
"""

import gzip
import os

import numpy as np

DIGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits.csv.gz")


def _digits():
    """scikit-learn's digits: (images 8x8 with values 0..16, labels)."""
    if os.path.exists(DIGITS):
        with gzip.open(DIGITS) as rows:
            table = np.loadtxt(rows, delimiter=",")  # 64 pixels, then the label
        return table[:, :64].reshape(-1, 8, 8), table[:, 64]
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("the examples train on real digits: run tools/bootstrap.sh (it "
                         f"fetches {DIGITS}), install scikit-learn, or cache MNIST with "
                         "keras.datasets.mnist.load_data()") from None
    digits = load_digits()
    return digits.images, digits.target


def load(num_train=6000, num_test=1000, held_out=0.2, seed=0):
    """Returns (x_train, y_train), (x_test, y_test), description: images float32 in
    [0, 1] with a channel axis (28x28x1 or 8x8x1), labels int64."""
    cached = os.path.expanduser("~/.keras/datasets/mnist.npz")
    if os.path.exists(cached):
        import keras

        (x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
        scale = np.float32(1 / 255)
        return ((x_train[:num_train, ..., None] * scale, y_train[:num_train].astype("int64")),
                (x_test[:num_test, ..., None] * scale, y_test[:num_test].astype("int64")),
                f"MNIST from the Keras cache ({num_train} to train, {num_test} held out)")
    pixels, labels = _digits()
    images = (pixels / 16.0).astype("float32")[..., None]
    labels = labels.astype("int64")
    order = np.random.default_rng(seed).permutation(len(labels))
    test = order[:int(len(order) * held_out)]
    train = order[len(test):]
    return ((images[train], labels[train]), (images[test], labels[test]),
            f"scikit-learn's digits ({len(train)} to train, {len(test)} held out)")
