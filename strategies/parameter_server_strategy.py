"""`tf_bps.ParameterServerStrategy`: a tf.distribute strategy over tf_bps workers.

Inside a worker it is MirroredStrategy: one replica per local device (all visible
GPUs, else the logical CPUs). Across workers, every reduction goes through
push_pull: local replicas are summed first, so one tensor per worker reaches the
summation servers.

TensorFlow offers one public extension point for this, tf.distribute.CrossDeviceOps
(PushPullCrossDeviceOps below). Everything else this module touches is private to
TensorFlow 2.21 or Keras 3; each touch point says why it is needed, and all of them
are in this file or saving.py:
  - MirroredExtended, subclassed: the global replica count, dataset sharding by
    worker, initial values from rank 0, and reductions that always cross workers.
  - input_util / cross_device_ops helpers that MirroredExtended itself uses.
  - Keras 3's savers and callbacks that write files (saving.py): saves become steps
    of the whole job, as under MultiWorkerMirroredStrategy.

With BYTEPS_ENABLE_ASYNC=1 training is asynchronous (tf_bps/training/asynchronous.py): reductions
stay inside the worker, and every update of a trainable variable is followed by an
exchange of its weights with the servers. The strategy then describes one worker's
replicas, as a local MirroredStrategy would, so that nothing waits for other workers.
"""

from __future__ import annotations

import contextlib
import itertools
import threading

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
from tensorflow.python.distribute import distribute_lib, input_util, mirrored_strategy
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.util import nest

import tf_bps as bps
from tf_bps.runtime import basics, ops, raw_ops
from tf_bps.runtime.compression import CoreCompressor, name_of
from tf_bps.runtime.config import Config
from tf_bps.strategies import optimizer_hooks, saving
from tf_bps.training import gradient_sync, loss_scale
from tf_bps.training.asynchronous import AsyncExchange
from tf_bps.training.compression import Compression
from tf_bps.training.gradient_sync import SyncOptions
from tf_bps.training.powersgd import PowerSGD

_WIRE_DTYPES = {tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64, tf.bool}


def _local_devices() -> list[str]:
    gpus = tf.config.list_logical_devices("GPU")
    return [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]


class PushPullCrossDeviceOps(tf.distribute.CrossDeviceOps):
    """Sums local replicas on one device, then across workers with push_pull (unless
    `across_workers` is False: asynchronous training reduces inside the worker only)."""

    def __init__(self, across_workers: bool = True, compression=Compression.none):
        super().__init__()
        self._across_workers = across_workers
        # Gradients go through the training wrappers' pipeline (gradient_sync.py).
        self._gradients = SyncOptions.for_strategy(compression)
        # Single values travel whole, in the wire type of a compression that has one
        # (fp16); PowerSGD and the core's compressors work on gradients only.
        self._wire = compression if compression is Compression.fp16 else Compression.none

    @property
    def _workers(self) -> int:
        # Read when a step is traced: an elastic job's size changes as it re-forms (and
        # elastic.TensorFlowKerasState has Keras trace its steps again).
        return bps.size() if self._across_workers else 1

    @property
    def _num_between_graph_workers(self):
        # CrossDeviceOps.reduce returns its input untouched, without calling
        # reduce_implementation, when it believes there is one worker and one device.
        return self._workers

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        # Single values (metrics, strategy.reduce) travel whole even with a compressor
        # of the core's: only gradients, which Keras reduces in batches, are compressed.
        return self._reduce(reduce_op, per_replica_value, destinations)

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        locals_ = [self._local_values(value) for value, _ in value_destination_pairs]
        totals = []
        for local in locals_:
            with tf.device(local[0].device):
                totals.append(tf.convert_to_tensor(self._local_sum(local)))
        if self._workers > 1:
            # Keras reduces a step's gradients in one batch, in the model's order, which
            # is their priority; the names keep each gradient's state (a compressor's
            # error feedback, PowerSGD's factors) from step to step.
            totals = gradient_sync.reduce_dense(totals, self._batch_names(len(totals)),
                                                self._gradients)
        return [self._finish(reduce_op, total, len(local), destinations)
                for total, local, (_, destinations) in zip(totals, locals_,
                                                           value_destination_pairs, strict=True)]

    @staticmethod
    def _batch_names(count: int, prefix: str = "PushPull") -> list[str]:
        # A prefix per kind of batch: a conditional's branch is a graph of its own, whose
        # unique names may be those of the step's graph around it.
        if tf.executing_eagerly():
            eager = "EagerGradient" if prefix == "PushPull" else f"{prefix}.eager"
            return [f"{eager}.{index}" for index in range(count)]
        graph = tf.compat.v1.get_default_graph()
        return [graph.unique_name(prefix) for _ in range(count)]

    def broadcast_implementation(self, tensor, destinations):
        return cross_device_ops_lib.simple_broadcast(tensor, destinations, always_mirrored=True)

    @staticmethod
    def _local_values(value) -> list:
        return list(value.values) if isinstance(value, values_lib.DistributedValues) else [value]

    @staticmethod
    def _local_sum(local: list):
        return tf.add_n(local) if len(local) > 1 else tf.identity(local[0])

    def _reduce(self, reduce_op, value, destinations):
        local = self._local_values(value)
        with tf.device(local[0].device):
            total = self._local_sum(local)
            if self._workers > 1:
                total = ops.push_pull(total, op=ops.Sum, compression=self._wire)
        return self._finish(reduce_op, total, len(local), destinations)

    def _finish(self, reduce_op, total, local_count: int, destinations):
        total = self._averaged(reduce_op, total, local_count)
        return cross_device_ops_lib.simple_broadcast(total, destinations, always_mirrored=True)

    def _averaged(self, reduce_op, total, local_count: int):
        if reduce_op != tf.distribute.ReduceOp.MEAN:
            return total
        with tf.device(total.device):
            # A plain tensor is one value per worker; a PerReplica, one per replica.
            count = local_count * self._workers
            return (total // count if total.dtype.is_integer
                    else total / tf.cast(count, total.dtype))

    def _all_reduce(self, reduce_op, value, replica_id, options):
        """The all-reduce of a replica that makes no merge_call (the strategy's
        `_bps_updates_in_the_replica`): the worker's one replica holds the worker's
        values, which go straight to push_pull, each in its own graph (a conditional's
        branch too), under names of their own."""
        flat = [tf.convert_to_tensor(item) for item in nest.flatten(value)]
        if self._workers > 1:
            flat = gradient_sync.reduce_dense(
                flat, self._batch_names(len(flat), prefix="ReplicaAllReduce"), self._gradients)
        return nest.pack_sequence_as(value, [self._averaged(reduce_op, total, 1)
                                             for total in flat])


class _ParameterServerExtended(mirrored_strategy.MirroredExtended):
    """MirroredExtended whose replicas span all workers of the tf_bps job."""

    def __init__(self, container_strategy, devices, config: Config, compression):
        self._variables_created = itertools.count()
        # BYTEPS_ENABLE_ASYNC: weights are exchanged after each update instead.
        self._bps_async = config.enable_async and bps.is_distributed()
        self._bps_exchange = AsyncExchange()
        self._bps_async_names = {}
        # Per thread: where a replica is in _bps_updates_in_the_replica.
        self._bps_in_the_replica = threading.local()
        cross_device_ops = PushPullCrossDeviceOps(not self._bps_async, compression)
        super().__init__(container_strategy, devices=devices, cross_device_ops=cross_device_ops)

    # The job's, read each time: an elastic job re-forms with other sizes and ranks, and
    # the next model.fit shards its input and counts its replicas by the new ones.
    @property
    def _bps_size(self) -> int:
        return bps.size()

    @property
    def _bps_rank(self) -> int:
        return bps.rank()

    @property
    def _bps_sync_size(self) -> int:
        """How many workers a reduction spans."""
        return 1 if self._bps_async else bps.size()

    # Private: MirroredExtended counts only this process's devices.
    @property
    def _num_replicas_in_sync(self):
        return len(self._devices) * self._bps_sync_size

    # Private: tells TensorFlow's input pipeline (end-of-data agreement) and Keras
    # (metric averaging, predict gathering) that replicas live in several processes.
    def _in_multi_worker_mode(self):
        return self._bps_sync_size > 1

    # Private: MirroredExtended hands int32 values to a local-only ReductionToOneDevice.
    def _get_cross_device_ops(self, value):
        return self._cross_device_ops

    # Private: MirroredExtended reduces to CPU destinations with a local-only
    # ReductionToOneDevice, which on a CPU machine would never cross workers.
    def _reduce_to(self, reduce_op, value, destinations, options):
        if isinstance(value, values_lib.Mirrored) and reduce_op == tf.distribute.ReduceOp.MEAN:
            return value  # Already equal everywhere.

        def reduce_one(item):
            # With several workers a plain tensor is this worker's value (MWMS does the
            # same), so it is reduced across workers like a PerReplica.
            if not isinstance(item, values_lib.DistributedValues) and self._bps_sync_size == 1:
                return cross_device_ops_lib.reduce_non_distributed_value(
                    reduce_op, item, destinations, self._num_replicas_in_sync)
            return self._cross_device_ops.reduce(reduce_op, item, destinations=destinations,
                                                 options=options)

        return nest.map_structure(reduce_one, value)

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        return self._cross_device_ops.batch_reduce(reduce_op, value_destination_pairs,
                                                   options=options)

    @contextlib.contextmanager
    def _bps_updates_in_the_replica(self):
        """Inside, the replica reduces and updates variables itself, without merge_call:
        with one replica in the worker its values are the worker's. TensorFlow refuses a
        merge_call in a conditional's branch, and Keras applies gradient_accumulation_steps
        in one (optimizer_hooks.install_accumulation)."""
        if len(self._devices) > 1:
            raise ValueError(
                f"gradient_accumulation_steps under ParameterServerStrategy needs one replica "
                f"per worker; this worker has {len(self._devices)} ({', '.join(self._devices)}):"
                " pass devices=[one device], or train without the strategy, with "
                "bps.DistributedOptimizer(..., backward_passes_per_step=N)")
        self._bps_in_the_replica.active = True
        try:
            yield
        finally:
            self._bps_in_the_replica.active = False

    # Private: TensorFlow asks it before each reduction or update in a replica (Keras
    # through tf.__internal__.distribute.interim.maybe_merge_call); False sends them to
    # _replica_ctx_all_reduce (PushPullCrossDeviceOps._all_reduce) and _replica_ctx_update.
    def _use_merge_call(self):
        if getattr(self._bps_in_the_replica, "active", False):
            return False
        return super()._use_merge_call()

    # Private: with BYTEPS_ENABLE_ASYNC, each update of a trainable variable (Keras's
    # optimizer step, weight decay) is followed by the exchange of its weights.
    def _update(self, var, fn, args, kwargs, group):
        update = super()._update
        if not self._bps_exchanges(var):
            return update(var, fn, args, kwargs, group)
        return self._bps_exchanged(var, lambda: update(var, fn, args, kwargs, group))

    # Private: the update a replica makes itself (_bps_updates_in_the_replica); with
    # merge_call it comes back through _update.
    def _replica_ctx_update(self, var, fn, args, kwargs, group):
        update = super()._replica_ctx_update
        if self._use_merge_call() or not self._bps_exchanges(var):
            return update(var, fn, args, kwargs, group)
        return self._bps_exchanged(var, lambda: update(var, fn, args, kwargs, group))

    def _bps_exchanges(self, var) -> bool:
        return self._bps_async and getattr(var, "trainable", False)

    def _bps_exchanged(self, var, run_update):
        """Runs the update of `var`, then exchanges its weights with the servers."""
        if id(var) not in self._bps_async_names:  # Numbered in first-update order.
            index = len(self._bps_async_names)
            self._bps_async_names[id(var)] = f"AsyncParameter.{index}.{var.name}"
        copies, names = [list(var.values)], [self._bps_async_names[id(var)]]
        before = AsyncExchange.snapshot(copies)
        result = run_update()
        self._bps_exchange.exchange(copies, before, names)
        return result

    # Private: gathers across workers too (Keras concatenates predict outputs this way).
    def _gather_to_implementation(self, value, destinations, axis, options):
        local = PushPullCrossDeviceOps._local_values(value)
        with tf.device(local[0].device):
            joined = tf.concat(local, axis=axis) if len(local) > 1 else tf.identity(local[0])
            if bps.is_distributed():
                perm = [axis] + [i for i in range(joined.shape.rank) if i != axis]
                moved = tf.transpose(joined, perm) if axis != 0 else joined
                gathered = raw_ops.allgather(moved)
                inverse = [perm.index(i) for i in range(len(perm))]
                joined = tf.transpose(gathered, inverse) if axis != 0 else gathered
        return cross_device_ops_lib.simple_broadcast(joined, destinations, always_mirrored=True)

    # Private: every worker starts from rank 0's initial values, as MWMS does.
    def _create_variable(self, next_creator, **kwargs):
        initial_value = kwargs.get("initial_value")
        if self._bps_size > 1 and initial_value is not None:
            index = next(self._variables_created)
            name = kwargs.get("name") or "variable"
            dtype = kwargs.get("dtype")

            def from_rank_0():
                value = initial_value() if callable(initial_value) else initial_value
                value = tf.convert_to_tensor(value, dtype=dtype)
                if value.dtype.base_dtype not in _WIRE_DTYPES:
                    return value
                return ops.broadcast(value, 0, name=f"VariableInit.{index}.{name}")

            kwargs["initial_value"] = from_rank_0
        return super()._create_variable(next_creator, **kwargs)

    # Public properties MirroredExtended answers True for everywhere: as in
    # MultiWorkerMirroredStrategy, only the chief (rank 0) writes checkpoints and summaries.
    @property
    def should_checkpoint(self):
        return self._bps_rank == 0

    @property
    def should_save_summary(self):
        return self._bps_rank == 0

    def _input_context(self) -> tf.distribute.InputContext:
        # Asynchronous workers are independent: each reads its whole input (as a
        # Horovod script shards it, if it wants), and predict returns all of it.
        if self._bps_async:
            return tf.distribute.InputContext(num_replicas_in_sync=self._num_replicas_in_sync)
        return tf.distribute.InputContext(num_input_pipelines=self._bps_size,
                                          input_pipeline_id=self._bps_rank,
                                          num_replicas_in_sync=self._num_replicas_in_sync)

    def _input_options(self, options):
        """On CPU replicas the batches are in their memory already: unless asked
        otherwise, they are read straight from the dataset's iterator rather than
        prefetched through a multi-device iterator, which costs every step (about 20 ms of
        a ResNet-50 step on 2 cores; examples/benchmarks/fit_pipeline_benchmark.py).

        With one CPU replica, as a worker without GPUs has, its input is read per
        replica: TensorFlow then makes no multi-device iterator at all. Such an iterator
        reads through a GeneratorDataset, whose kernel sets glibc's M_TRIM_THRESHOLD
        to 128 KiB for the whole process; malloc then no longer raises its mmap threshold
        (128 KiB to begin with), so larger tensors are mapped and faulted in afresh every
        step (tf_bps/runtime/heap.py)."""
        if options is not None or not all("CPU" in d.upper() for d in self._devices):
            return options
        if len(self._devices) == 1:
            return tf.distribute.InputOptions(
                experimental_fetch_to_device=False,
                experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA)
        return tf.distribute.InputOptions(experimental_fetch_to_device=False)

    # Private: shards the dataset by worker (auto-sharding, as MultiWorkerMirroredStrategy).
    def _experimental_distribute_dataset(self, dataset, options):
        options = self._input_options(options)
        return input_util.get_distributed_dataset(
            dataset, self._input_workers_with_options(options), self._container_strategy(),
            num_replicas_in_sync=self._num_replicas_in_sync,
            input_context=self._input_context(), options=options)

    def _distribute_datasets_from_function(self, dataset_fn, options):
        options = self._input_options(options)
        return input_util.get_distributed_datasets_from_function(
            dataset_fn, self._input_workers_with_options(options), [self._input_context()],
            self._container_strategy(), options)


class ParameterServerStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """Synchronous data parallelism over a tf_bps job.

        strategy = tf_bps.ParameterServerStrategy()
        with strategy.scope():
            model = build_model()
            model.compile(...)
        model.fit(dataset)

    `num_replicas_in_sync` counts the replicas of all workers; `fit` averages
    gradients over all of them once, and reports metrics averaged over workers.
    `compression`: bps.Compression.none, .fp16 (what travels whole goes as float16),
    .powersgd(...) (kernels as low-rank factors), or one of BytePS's
    compressors, run by the core on float32 gradients (.onebit, .topk, .randomk,
    .dithering, .from_params).
    """

    # Private: MirroredExtended reads this class attribute of its container.
    _collective_key_base = 0
    # bps.DistributedOptimizer refuses to run under a strategy that says this: the
    # gradients would be averaged twice.
    synchronises_gradients_with_tf_bps = True

    def __init__(self, devices=None, compression=Compression.none):
        # Deliberately not MultiWorkerMirroredStrategy.__init__ (TF_CONFIG, collectives):
        # the subclass is a marker, because Keras 3 averages metrics across workers
        # only for instances of that class (backend/tensorflow/trainer.py).
        if not bps.is_initialized():
            bps.init()
        config = basics.config()
        settings = config.gradient_step_options()
        if settings:
            raise ValueError(f"{', '.join(settings)} works through bps.DistributedOptimizer "
                             "and DistributedGradientTape; ParameterServerStrategy reduces "
                             "whole gradients and has no step of its own to check")
        _check_compression(compression, config)
        extended = _ParameterServerExtended(self, list(devices or _local_devices()), config,
                                            compression)
        distribute_lib.Strategy.__init__(self, extended)
        self._bps_cluster_resolver = None
        saving.install()
        # Error feedback needs each step's learning rate; the optimizer has it.
        self._bps_tells_learning_rate = (isinstance(compression, CoreCompressor)
                                         and compression.error_feedback)
        if self._bps_tells_learning_rate:
            optimizer_hooks.install()
        optimizer_hooks.install_accumulation()  # gradient_accumulation_steps
        loss_scale.install()  # mixed_float16: every worker skips the same steps

    def reduce(self, reduce_op, value, axis):
        # Keras reduces multi-worker metric results with axis=0 even when they are
        # scalars, which Strategy.reduce rejects; a scalar has no axis to reduce.
        parts = value.values if isinstance(value, values_lib.DistributedValues) else [value]
        if axis is not None and all(getattr(p, "shape", None) is not None and p.shape.rank == 0
                                    for p in parts):
            axis = None
        return super().reduce(reduce_op, value, axis)

    @property
    def cluster_resolver(self):
        """The job as MultiWorkerMirroredStrategy describes it: task_type "worker",
        task_id = rank, and a cluster spec listing each worker's host by rank."""
        if self._bps_cluster_resolver is None:
            spec = tf.train.ClusterSpec({"worker": list(basics.worker_hosts())})
            self._bps_cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                spec, task_type="worker", task_id=bps.rank())
        return self._bps_cluster_resolver

    def __deepcopy__(self, memo):
        return self  # One strategy per process: copies would share the job anyway.


def _check_compression(compression, config: Config) -> None:
    if not (compression in (Compression.none, Compression.fp16)
            or isinstance(compression, (PowerSGD, CoreCompressor))):
        raise ValueError(f"compression={compression!r} is not supported by the strategy: "
                         "use bps.Compression.none, .fp16, .powersgd(...) or one of the "
                         "core's (.onebit, .topk, .randomk, .dithering)")
    if compression is not Compression.none and config.enable_async:
        raise ValueError(f"compression={name_of(compression)} does not apply with "
                         "BYTEPS_ENABLE_ASYNC=1: workers exchange full-precision weights")


class MirroredStrategy(ParameterServerStrategy):
    """BytePS's `bps.distribute.MirroredStrategy(devices=...)`: mirrored replicas on this
    worker's `devices`, synchronised across workers through tf_bps."""

    def __init__(self, devices=None, cross_device_ops=None, compression=Compression.none):
        if cross_device_ops is not None:
            raise ValueError(f"cross_device_ops={cross_device_ops!r} is not supported: tf_bps "
                             "strategies always reduce through push_pull")
        super().__init__(devices=devices, compression=compression)
