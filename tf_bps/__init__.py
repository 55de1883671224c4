"""tf_bps: BytePS-style distributed training for TensorFlow 2 and Keras 3.

    import tf_bps as bps
    bps.init()
    summed = bps.push_pull(tensor, average=True, name="grad0")

The module offers what `horovod.tensorflow` and `byteps.tensorflow` scripts call, so
that such a script moves here by changing its import line; `tf_bps.keras` does the
same for `horovod.tensorflow.keras` / `byteps.tensorflow.keras`.

Importing tf_bps does not import TensorFlow: servers and the scheduler never need
it. The TensorFlow operations load on first use.
"""

from tf_bps.runtime.basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_distributed,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    resume,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
    suspend,
    sycl_built,
)
from tf_bps.runtime.config import ConfigError
from tf_bps.runtime.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from tf_bps.training.compression import Compression

__version__ = "0.1.0"

# Names that need TensorFlow, imported on first use: module -> names.
_LAZY = {
    "tf_bps.runtime.ops": (
        "push_pull", "allreduce", "grouped_allreduce", "broadcast", "broadcast_",
        "broadcast_variables", "broadcast_global_variables", "broadcast_object", "allgather",
        "grouped_allgather", "allgather_object", "alltoall", "reducescatter",
        "grouped_reducescatter", "join", "barrier", "rank_op", "local_rank_op", "size_op",
        "local_size_op", "process_set_included_op", "Average", "Sum", "Adasum", "Min", "Max",
        "Product", "ReduceOp", "set_compression_learning_rate"),
    "tf_bps.training.distributed": (
        "DistributedOptimizer", "DistributedGradientTape", "PartialDistributedOptimizer",
        "PartialDistributedGradientTape", "load_model"),
    "tf_bps.training.sync_batch_norm": ("SyncBatchNormalization",),
    "tf_bps.strategies": ("ParameterServerStrategy",),
}
# tf_bps.distribute is BytePS's name for the strategies (bps.distribute.MirroredStrategy).
_LAZY_MODULES = {"callbacks": "tf_bps.keras.callbacks", "keras": "tf_bps.keras",
                 "distribute": "tf_bps.strategies", "elastic": "tf_bps.elastic"}
_TENSORFLOW_NAMES = {name for names in _LAZY.values() for name in names} | set(_LAZY_MODULES)


def __getattr__(name):
    import importlib

    module = _LAZY_MODULES.get(name) or next(
        (module for module, names in _LAZY.items() if name in names), None)
    if module is None:
        raise AttributeError(f"module 'tf_bps' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name not in ("tensorflow", "keras"):
            raise
        # A launcher or server machine installs tf_bps without TensorFlow.
        raise ModuleNotFoundError(
            f"tf_bps.{name} needs TensorFlow, which is not installed here: "
            "pip install 'tf_bps[tensorflow]' (the launcher, scheduler and server "
            "work without it)", name=error.name) from None
    return loaded if name in _LAZY_MODULES else getattr(loaded, name)


__all__ = ["init", "shutdown", "suspend", "resume", "is_initialized", "is_distributed", "rank",
           "size", "local_rank", "local_size", "cross_rank", "cross_size", "is_homogeneous",
           "mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
           "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "sycl_built",
           "start_timeline", "stop_timeline",
           "Compression", "ConfigError", "ProcessSet", "add_process_set", "global_process_set",
           "remove_process_set", *sorted(_TENSORFLOW_NAMES)]
