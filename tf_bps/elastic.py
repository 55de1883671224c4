"""Elastic training with Horovod's names (`horovod.tensorflow.elastic`), so that an
elastic script runs with its import line switched: `run`, the states and the two
exceptions its loop handles. See tf_bps/training/elastic.py."""

from tf_bps.training.elastic import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    HostUpdateResult,
    InternalError,
    ObjectState,
    State,
    TensorFlowKerasState,
    TensorFlowState,
    run,
)
from tf_bps.training.preemption import on_preemption

__all__ = ["HorovodInternalError", "HostUpdateResult", "HostsUpdatedInterrupt", "InternalError",
           "ObjectState", "State", "TensorFlowKerasState", "TensorFlowState", "on_preemption",
           "run"]
