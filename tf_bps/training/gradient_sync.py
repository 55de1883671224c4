"""How gradients are synchronised, whatever asks (DistributedOptimizer,
DistributedGradientTape, their partial forms, ParameterServerStrategy): the arguments
Horovod's wrappers share (SyncOptions), the one pipeline of a step's push_pulls
(reduce_dense; synchronise_gradients adds sparse gradients), and what a wrapper keeps
from step to step (_GradientSync: local variables, down-sampling, the step-time check)."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tf_bps.runtime import basics, raw_ops
from tf_bps.runtime.compression import CoreCompressor, core_spec, name_of
from tf_bps.runtime.compression import from_config as compression_from_config
from tf_bps.runtime.process_sets import process_set_id, ranks_of
from tf_bps.runtime.raw_ops import Average, ReduceOp, Sum
from tf_bps.training import fusion
from tf_bps.training.compression import Compression
from tf_bps.training.downsample import DownSampler
from tf_bps.training.perf_check import StepTimeCheck
from tf_bps.training.powersgd import PowerSGD


@dataclasses.dataclass(frozen=True)
class SyncOptions:
    """How gradients are synchronised: the arguments Horovod's wrappers share, checked."""

    compression: type = Compression.none
    op: ReduceOp = Average
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    device_dense: str = ""
    device_sparse: str = ""
    process_set_id: int = 0  # 0: every worker
    fusion: int = 0  # PERSEUS_ALLREDUCE_FUSION: buffers a step's gradients are packed into
    # Otherwise gradients under fusion_threshold bytes share buffers of at most
    # fusion_bucket_bytes (BYTEPS_FUSION_THRESHOLD, BYTEPS_PARTITION_BYTES); 0: none.
    fusion_threshold: int = 0
    fusion_bucket_bytes: int = 0
    # BYTEPS_ENABLE_ASYNC: steps apply local gradients and exchange weights (asynchronous.py)
    asynchronous: bool = False
    # PERSEUS_DOWNSAMPLE_N_ELEMENTS / _GRADIENT_MOMENTUM (downsample.py) and
    # PERSEUS_PERF_CHECK_N_STEPS (perf_check.py); 1, 1.0 and 0 leave them off.
    downsample: int = 1
    gradient_momentum: float = 1.0
    perf_check_steps: int = 0

    @classmethod
    def from_arguments(cls, compression=Compression.none, op=Average, sparse_as_dense=False,
                       gradient_predivide_factor=1.0, device_dense="", device_sparse="",
                       num_groups=0, groups=None, process_set=None,
                       compression_params=None) -> SyncOptions:
        if compression_params is not None:
            if compression is not Compression.none:
                raise ValueError(f"compression={name_of(compression)} and compression_params="
                                 f"{compression_params!r} both choose the compression: pass "
                                 "one of them")
            compression = Compression.from_params(compression_params)
        if op not in (Average, Sum):
            raise ValueError(f"op={op!r} is not supported: use bps.Average or bps.Sum")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor!r} needs "
                             f"op=bps.Average, not {ReduceOp(op).name}")
        if not gradient_predivide_factor > 0:
            raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor!r} must "
                             "be > 0")
        # Grouping only decides which reductions Horovod fuses; every gradient of a step
        # is in flight at once here, so any valid grouping gives the same result.
        if not isinstance(num_groups, int) or num_groups < 0:
            raise ValueError(f"num_groups={num_groups!r} must be an integer >= 0")
        if groups is not None and not (isinstance(groups, int) and groups > 0
                                       or isinstance(groups, (list, tuple))):
            raise ValueError(f"groups={groups!r} must be a positive integer or a list of "
                             "lists of variables")
        set_id = process_set_id(process_set)
        config = basics.config()
        if compression is Compression.none:  # AIACC's wire type, unless the code chose one
            compression = compression_from_config(config) or compression
        for argument, device in (("device_dense", device_dense),
                                 ("device_sparse", device_sparse)):
            if not isinstance(device, str):
                raise ValueError(f"{argument}={device!r} must be a device string")
        if config.enable_async:
            # The servers keep full-precision parameters for every worker.
            if set_id != 0:
                raise ValueError("BYTEPS_ENABLE_ASYNC=1 trains every worker against the same "
                                 "parameters; a process set is not supported with it")
            if compression is not Compression.none:
                raise ValueError(f"compression={name_of(compression)} does not apply with "
                                 "BYTEPS_ENABLE_ASYNC=1: workers exchange full-precision "
                                 "weights, not gradients (unset PERSEUS_ALLREDUCE_DTYPE too)")
            if config.gradient_step_options():
                raise ValueError(f"{', '.join(config.gradient_step_options())} works on "
                                 "synchronised gradients; it cannot be combined with "
                                 "BYTEPS_ENABLE_ASYNC=1")
        if isinstance(compression, CoreCompressor) and set_id != 0:
            # The servers sum compressed pushes of all workers (custom_ops/compression).
            raise ValueError(f"compression={name_of(compression)} compresses push_pulls of "
                             f"all workers only, not in process_set={process_set!r}")
        if isinstance(compression, PowerSGD) and gradient_predivide_factor != 1.0:
            raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor!r} does "
                             "not combine with Compression.powersgd, which averages (or sums) "
                             "its factors itself")
        return cls(compression, ReduceOp(op), bool(sparse_as_dense),
                   float(gradient_predivide_factor), device_dense, device_sparse, set_id,
                   config.fusion, config.fusion_threshold, config.partition_bytes,
                   config.enable_async, config.downsample,
                   config.gradient_momentum, config.perf_check_steps)

    @classmethod
    def for_strategy(cls, compression) -> SyncOptions:
        """How ParameterServerStrategy reduces: each worker's sum of its replicas, summed
        over all workers (it divides afterwards), with the job's wire type and fusion."""
        config = basics.config()
        if compression is Compression.none:
            compression = compression_from_config(config) or compression
        return cls(compression, Sum, fusion=config.fusion,
                   fusion_threshold=config.fusion_threshold,
                   fusion_bucket_bytes=config.partition_bytes)

    def group_size(self) -> int:
        return len(ranks_of(self.process_set_id))

    def synchronises_here(self) -> bool:
        """Whether this worker's gradients are reduced at all. With one worker (and no
        BYTEPS_FORCE_DISTRIBUTED) they are the average already; Horovod leaves them
        local outside a process set and in a set of one."""
        if not basics.is_distributed():
            return False
        if self.process_set_id == 0:
            return True
        return basics.rank() in ranks_of(self.process_set_id) and self.group_size() > 1

    def refuse_asynchronous(self, what: str) -> None:
        if self.asynchronous:
            raise ValueError(
                f"BYTEPS_ENABLE_ASYNC=1: {what} cannot train asynchronously, because it only "
                "synchronises gradients and the exchange happens after the optimizer's step; "
                "use bps.DistributedOptimizer with a Keras optimizer, or "
                "tf_bps.ParameterServerStrategy")

    def plan(self) -> tuple[ReduceOp, float, float]:
        """(op on the wire, prescale, postscale). A predivide factor f splits an average
        into 1/f before the sum and f/size after it, as Horovod does."""
        if self.gradient_predivide_factor == 1.0:
            return self.op, 1.0, 1.0
        factor = self.gradient_predivide_factor
        return Sum, 1.0 / factor, factor / self.group_size()


@tf.function
def _push_pull_group(tensors, names, op, set_id, specs):
    """All push_pulls of one step in one graph, so they are in flight together.
    `specs`: each tensor's core compressor ("" for none)."""
    return [raw_ops.push_pull(t, n, ReduceOp(op), set_id=set_id, compression=c)
            for t, n, c in zip(tensors, names, specs, strict=True)]


def synchronise_gradients(grads, names, options: SyncOptions = SyncOptions(),
                          sampler: DownSampler | None = None, learning_rate=None):
    """push_pulls every gradient (None stays None); `names` must be stable per step. A
    tf.IndexedSlices stays sparse unless `options.sparse_as_dense`; dense gradients go
    through reduce_dense."""
    grads = list(grads)
    if not options.synchronises_here():
        return grads  # One worker (in the set), or not in it: gradients stay local.
    results = [None] * len(grads)
    dense_index, dense_grads, dense_names = [], [], []
    for index, (grad, name) in enumerate(zip(grads, names, strict=True)):
        if grad is None:
            continue
        if isinstance(grad, tf.IndexedSlices):
            if not options.sparse_as_dense:
                with raw_ops.placed(options.device_sparse):
                    results[index] = raw_ops.allreduce_indexed_slices(
                        grad, name, options.op, options.process_set_id)
                continue
            grad = tf.convert_to_tensor(grad)
        dense_index.append(index)
        dense_grads.append(grad)
        dense_names.append(name)
    reduced = reduce_dense(dense_grads, dense_names, options, sampler, learning_rate)
    for index, tensor in zip(dense_index, reduced, strict=True):
        results[index] = tensor
    return results


def reduce_dense(tensors: list, names: list[str], options: SyncOptions,
                 sampler: DownSampler | None = None, learning_rate=None) -> list:
    """The one gradient pipeline, for the wrappers and the strategy alike: each dense
    tensor reduced over the group, in flight together. PowerSGD takes the matrices it
    compresses; the rest are down-sampled (with a `sampler`: this step's share of those
    of known size), compressed, fused, declared in the given order (their priority),
    push_pulled, then unfused, decompressed and scaled back. `learning_rate`: the
    step's, which a core compressor's error feedback needs to rescale what it carries
    when the rate changes."""
    results = [None] * len(tensors)
    index = list(range(len(tensors)))
    set_id = options.process_set_id
    if isinstance(options.compression, PowerSGD):
        # Matrices travel as low-rank factors; the rest as they are, below.
        powersgd, whole = options.compression, []
        for i in index:
            if powersgd.compresses(tensors[i]):
                with raw_ops.placed(options.device_dense):
                    results[i] = powersgd.synchronise(tensors[i], names[i], options.op, set_id,
                                                      options.group_size())
            else:
                whole.append(i)
        index = whole
        options = dataclasses.replace(options, compression=Compression.none)
    if not index:
        return results
    grads, grad_names = [tensors[i] for i in index], [names[i] for i in index]
    sampled, restore = [], None
    if sampler:
        sampled = [i for i, g in enumerate(grads) if g.shape.is_fully_defined()]
        shares, restore = sampler.sample([grads[i] for i in sampled],
                                         [grad_names[i] for i in sampled])
        for i, share in zip(sampled, shares, strict=True):
            grads[i] = share
    summed = _push_pull_compressed(grads, grad_names, options, learning_rate)
    if restore:
        for i, full in zip(sampled, restore([summed[i] for i in sampled]), strict=True):
            summed[i] = full
    for i, tensor in zip(index, summed, strict=True):
        results[i] = tensor
    return results


def _push_pull_compressed(grads: list, names: list[str], options: SyncOptions,
                          learning_rate) -> list:
    """Compress, fuse, declare, push_pull; then unfuse, decompress, scale."""
    op, prescale, postscale = options.plan()
    set_id = options.process_set_id
    tensors, contexts = [], []
    for grad in grads:
        compressed, context = options.compression.compress(raw_ops.scale(grad, prescale))
        tensors.append(compressed)
        contexts.append(context)
    wire_names, unfuse = names, None
    if options.fusion:
        tensors, wire_names, unfuse = fusion.fuse(tensors, names, options.fusion)
    elif options.fusion_threshold:
        tensors, wire_names, unfuse = fusion.fuse_small(
            tensors, names, options.fusion_threshold, options.fusion_bucket_bytes)
    # Priority follows the order given (the model's variables'), not the backward pass's:
    # the next step's forward pass needs the first layers' sums first.
    basics.declare(wire_names)
    # A core compressor travels with each float32 tensor, fused buffers included (the
    # core compresses those of BYTEPS_MIN_COMPRESS_BYTES or more); its compress() and
    # decompress() leave the values as they are.
    specs = tuple(core_spec(options.compression, t.dtype) for t in tensors)
    rate_told = []
    if (learning_rate is not None and isinstance(options.compression, CoreCompressor)
            and options.compression.error_feedback):
        told = raw_ops.set_compression_learning_rate(learning_rate)
        rate_told = [told] if told is not None else []
    with raw_ops.placed(options.device_dense), tf.control_dependencies(rate_told):
        if tf.executing_eagerly():
            summed = _push_pull_group(tensors, tuple(wire_names), int(op), set_id, specs)
        else:
            summed = [raw_ops.push_pull(t, n, op, set_id=set_id, compression=c)
                      for t, n, c in zip(tensors, wire_names, specs, strict=True)]
    if unfuse:
        summed = unfuse(summed)
    return [raw_ops.scale(options.compression.decompress(tensor, context), postscale)
            for tensor, context in zip(summed, contexts, strict=True)]


class _GradientSync:
    """What the three wrappers share: their SyncOptions, the state of down-sampling
    and of the step-time check, and Horovod's register_local_var /
    register_local_source: variables whose gradients stay on this worker (not
    synchronised), optionally scaled by 1/size so that they have the magnitude of an
    averaged gradient."""

    def _bps_init_sync(self, options: SyncOptions, prefix: str, scale_local_gradients):
        if not isinstance(scale_local_gradients, bool):
            raise ValueError(f"scale_local_gradients={scale_local_gradients!r} must be a bool")
        self._bps_options = options
        self._bps_scale_local = scale_local_gradients
        self._bps_local_refs = set()
        self._bps_local_layers = []
        self._bps_sampler = (DownSampler(options.downsample, options.gradient_momentum)
                             if options.downsample > 1 else None)
        self._bps_step_check = (StepTimeCheck(options.perf_check_steps, prefix)
                                if options.perf_check_steps else None)

    def _bps_register_local(self, variable):
        self._bps_local_refs.add(id(variable))  # Keras variables have no ref(); ids do.

    def _bps_register_local_layers(self, layers: list):
        """Horovod's `local_layers`: their trainable weights are local. Read at each step,
        not now, so that a layer Keras builds on its first call counts too."""
        self._bps_local_layers = list(layers)

    def _bps_is_local(self, variable) -> bool:
        return id(variable) in self._bps_local_refs or any(
            variable is weight for layer in self._bps_local_layers
            for weight in layer.trainable_weights)

    def _bps_sync(self, grads, variables, names, learning_rate=None):
        """Synchronises the gradients of shared variables; local ones stay (scaled)."""
        options = self._bps_options
        if self._bps_step_check and options.synchronises_here():
            self._bps_step_check.begin(grads)
        shared = [i for i, v in enumerate(variables) if not self._bps_is_local(v)]
        synced = synchronise_gradients([grads[i] for i in shared], [names[i] for i in shared],
                                       options, self._bps_sampler, learning_rate)
        results = list(grads)
        for i, grad in zip(shared, synced, strict=True):
            results[i] = grad
        size = options.group_size()
        if self._bps_scale_local and len(shared) < len(results) and size > 1:
            for i, variable in enumerate(variables):
                grad = results[i]
                if not self._bps_is_local(variable) or grad is None:
                    continue
                if isinstance(grad, tf.IndexedSlices):  # An embedding's gradient stays sparse.
                    results[i] = tf.IndexedSlices(grad.values / size, grad.indices,
                                                  grad.dense_shape)
                else:
                    results[i] = grad / size
        return results

    def _bps_step_done(self, done) -> None:
        """The step's update (or synchronisation) is `done` (tensors to wait for)."""
        if self._bps_step_check and self._bps_options.synchronises_here():
            self._bps_step_check.end(done)
