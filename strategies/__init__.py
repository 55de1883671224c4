"""tf.distribute strategies backed by tf_bps (installed as tf_bps.strategies, also
reachable as tf_bps.distribute, BytePS's name)."""

from tf_bps.strategies.parameter_server_strategy import (
    MirroredStrategy,
    ParameterServerStrategy,
    PushPullCrossDeviceOps,
)

__all__ = ["MirroredStrategy", "ParameterServerStrategy", "PushPullCrossDeviceOps"]
