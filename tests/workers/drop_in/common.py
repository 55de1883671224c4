"""Shared by the drop-in scripts: per-rank synthetic data in place of the downloads the
public examples make, and the report of the final weights the test compares."""

import hashlib
import json
import os

import numpy as np


def synthetic_mnist(seed: int, count: int = 512):
    """MNIST-shaped uint8 images and int labels (what keras.datasets.mnist returns)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count)
    images = rng.integers(0, 128, size=(count, 28, 28)).astype("uint8")
    for digit in range(10):  # A learnable signal: a bright band of rows per label.
        images[labels == digit, digit * 2:digit * 2 + 4] += 120
    return images, labels


def report(rank: int, variables, **extra) -> None:
    """Prints the digest of the variables' exact bytes, so ranks compare bit for bit."""
    digest = hashlib.sha256()
    for variable in variables:
        digest.update(np.ascontiguousarray(np.asarray(variable)).tobytes())
    out = os.environ.get("DROP_IN_OUT")
    if out:
        np.savez(os.path.join(out, f"weights{rank}.npz"), *[np.asarray(v) for v in variables])
    print("WEIGHTS " + json.dumps({"rank": rank, "digest": digest.hexdigest(),
                                   "count": len(variables), **extra}), flush=True)
