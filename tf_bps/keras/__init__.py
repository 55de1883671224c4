"""Keras 3 integration: callbacks (tf_bps.keras.callbacks) and the training wrappers."""

from tf_bps.keras import callbacks
from tf_bps.training import DistributedGradientTape, DistributedOptimizer

__all__ = ["callbacks", "DistributedOptimizer", "DistributedGradientTape"]
