"""tf_bps for Keras scripts: what `horovod.tensorflow.keras` and `byteps.tensorflow.keras`
offer (init, rank, allreduce, DistributedOptimizer, callbacks, load_model, ...), so that
`import tf_bps.keras as bps` replaces their import line."""

from tf_bps import (
    Compression,
    ProcessSet,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    sycl_built,
)
from tf_bps.keras import callbacks, elastic
from tf_bps.runtime.ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_object,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    broadcast_object,
    broadcast_variables,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    push_pull,
    reducescatter,
)
from tf_bps.training.distributed import (
    DistributedGradientTape,
    DistributedOptimizer,
    PartialDistributedGradientTape,
    PartialDistributedOptimizer,
    load_model,
)
from tf_bps.training.sync_batch_norm import SyncBatchNormalization

__all__ = ["Adasum", "Average", "Compression", "DistributedGradientTape", "DistributedOptimizer",
           "Max", "Min", "PartialDistributedGradientTape", "PartialDistributedOptimizer",
           "ProcessSet", "Product", "Sum", "SyncBatchNormalization", "add_process_set", "allgather",
           "allgather_object", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_object",
           "broadcast_variables", "callbacks", "ccl_built", "cross_rank", "cross_size",
           "cuda_built", "ddl_built", "elastic", "global_process_set", "gloo_built", "gloo_enabled",
           "grouped_allreduce", "grouped_reducescatter", "init", "is_homogeneous", "is_initialized",
           "join", "load_model", "local_rank", "local_size", "mpi_built", "mpi_enabled",
           "mpi_threads_supported", "nccl_built", "push_pull", "rank", "reducescatter",
           "remove_process_set", "rocm_built", "shutdown", "size", "sycl_built"]
