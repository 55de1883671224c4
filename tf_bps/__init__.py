"""tf_bps: BytePS-style distributed training for TensorFlow 2 and Keras 3.

    import tf_bps as bps
    bps.init()
    summed = bps.push_pull(tensor, average=True, name="grad0")

Importing tf_bps does not import TensorFlow: servers and the scheduler never need
it. The TensorFlow operations load on first use.
"""

from tf_bps.basics import (
    init,
    is_distributed,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from tf_bps.compression import Compression
from tf_bps.config import ConfigError

__version__ = "0.1.0"

# Names that need TensorFlow, imported on first use: module -> names.
_LAZY = {
    "tf_bps.ops": ("push_pull", "broadcast", "broadcast_variables", "allgather", "Average",
                   "Sum", "ReduceOp"),
    "tf_bps.training": ("DistributedOptimizer", "DistributedGradientTape"),
    "tf_bps.strategies": ("ParameterServerStrategy",),
}
_LAZY_MODULES = {"callbacks": "tf_bps.keras.callbacks", "keras": "tf_bps.keras"}
_TENSORFLOW_NAMES = {name for names in _LAZY.values() for name in names} | set(_LAZY_MODULES)


def __getattr__(name):
    import importlib

    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    for module, names in _LAZY.items():
        if name in names:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'tf_bps' has no attribute {name!r}")


__all__ = ["init", "shutdown", "is_initialized", "is_distributed", "rank", "size", "local_rank",
           "local_size",
           "Compression", "ConfigError", *sorted(_TENSORFLOW_NAMES)]
