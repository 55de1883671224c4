"""tf_bps: BytePS-style distributed training for TensorFlow 2 and Keras 3.

    import tf_bps as bps
    bps.init()
    summed = bps.push_pull(tensor, average=True, name="grad0")

Importing tf_bps does not import TensorFlow: servers and the scheduler never need
it. The TensorFlow operations load on first use.
"""

from tf_bps.basics import init, is_initialized, local_rank, local_size, rank, shutdown, size
from tf_bps.compression import Compression
from tf_bps.config import ConfigError

__version__ = "0.1.0"

_TENSORFLOW_NAMES = {"push_pull", "broadcast", "broadcast_variables", "Average", "Sum",
                     "ReduceOp"}


def __getattr__(name):
    if name in _TENSORFLOW_NAMES:
        from tf_bps import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'tf_bps' has no attribute {name!r}")


__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "Compression", "ConfigError", *sorted(_TENSORFLOW_NAMES)]
