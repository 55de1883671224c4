"""tf.distribute strategies backed by tf_bps (installed as tf_bps.strategies)."""

from tf_bps.strategies.parameter_server_strategy import (
    ParameterServerStrategy,
    PushPullCrossDeviceOps,
)

__all__ = ["ParameterServerStrategy", "PushPullCrossDeviceOps"]
