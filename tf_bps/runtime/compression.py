"""Gradient compression applied around push_pull (Horovod's Compression API), and
BytePS's compressors, which the core runs (CoreCompressor; BytePS's compression_params
dict builds them too: Compression.from_params)."""

from __future__ import annotations

from collections.abc import Mapping


class Compressor:
    """Turns a tensor into what travels, and back."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, context):
        return tensor


class NoneCompressor(Compressor):
    pass


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 and restores their dtype afterwards."""

    @staticmethod
    def compress(tensor):
        import tensorflow as tf

        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, context):
        import tensorflow as tf

        return tensor if context is None else tf.cast(tensor, context)


class ScaledFP16Compressor(Compressor):
    """AIACC-Training's wire types (PERSEUS_ALLREDUCE_DTYPE): floating-point tensors
    travel as float16, multiplied by `scale` first and divided by it after, so that
    small gradients keep their digits. `mixed`: only tensors of two or more dimensions
    (kernels) do; vectors (biases, normalisation parameters) keep their precision."""

    def __init__(self, scale: float, mixed: bool):
        self.scale = scale
        self.mixed = mixed

    def __repr__(self):
        return (f"PERSEUS_ALLREDUCE_DTYPE={'mixed' if self.mixed else 'float16'} "
                f"(scale {self.scale})")

    def compress(self, tensor):
        import tensorflow as tf

        if (not tensor.dtype.is_floating or tensor.dtype == tf.float16
                or (self.mixed and tensor.shape.rank is not None and tensor.shape.rank < 2)):
            return tensor, None
        return tf.cast(tensor * tf.cast(self.scale, tensor.dtype), tf.float16), tensor.dtype

    def decompress(self, tensor, context):
        import tensorflow as tf

        if context is None:
            return tensor
        return tf.cast(tensor, context) / tf.cast(self.scale, context)


class CoreCompressor(Compressor):
    """One of BytePS's compressors (onebit, topk, randomk, dithering), run by the core on
    each partition of a float32 push_pull: compressed on the way to the servers, the
    servers' sum compressed on the way back (custom_ops/compression/compressor.h). The
    tensor itself goes to push_pull unchanged; `spec` is what the core reads."""

    def __init__(self, spec: str):
        from tf_bps.runtime import core

        self.spec = core.worker_engine().canonical_compression(spec)

    def __repr__(self):
        return f"Compression.{self.spec.split()[0]}({', '.join(self.spec.split()[1:])})"

    @property
    def error_feedback(self) -> bool:
        """Whether what it leaves out is carried to the next step (ef=vanilla): then the
        learning rate of each step matters (ops.set_compression_learning_rate)."""
        return "ef=vanilla" in self.spec.split()

    def __eq__(self, other):
        return isinstance(other, CoreCompressor) and other.spec == self.spec

    def __hash__(self):
        return hash(self.spec)


def _spec(name: str, **options) -> CoreCompressor:
    words = [name]
    for key, value in options.items():
        if value is None:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        # The spec is words of key=value: a value with a space or '=' would smuggle in
        # another key (or hide this one) instead of being refused by the core.
        if not text or any(c.isspace() or c == "=" for c in text):
            raise ValueError(f"compression: {key}={value!r} is not a valid value")
        words.append(f"{key}={text}")
    return CoreCompressor(" ".join(words))


# BytePS's compression_params (byteps.mxnet.DistributedTrainer; docs/gradient-compression.md).
_PARAM_KEYS = ("compressor", "k", "scaling", "ef", "momentum", "mu", "seed", "partition",
               "normalize", "fp16")
_CORE_COMPRESSORS = ("onebit", "topk", "randomk", "dithering")


def _from_params(params) -> Compressor:
    if not isinstance(params, Mapping):
        raise ValueError(f"compression_params={params!r} must be a dict such as "
                         "{'compressor': 'topk', 'k': 0.01, 'ef': 'vanilla'}")
    for key, value in params.items():
        if key not in _PARAM_KEYS:
            raise ValueError(f"compression_params: unknown key {key!r} (value {value!r}); "
                             f"the keys are {', '.join(_PARAM_KEYS)}")
    fp16 = params.get("fp16", False)
    if not isinstance(fp16, bool):
        raise ValueError(f"compression_params: 'fp16': {fp16!r} must be True or False")
    name = params.get("compressor")
    # As in BytePS, a key set to None counts as absent.
    options = {key: value for key, value in params.items()
               if key not in ("compressor", "fp16") and value is not None}
    if name is None:
        if options:
            key, value = next(iter(options.items()))
            raise ValueError(f"compression_params: {key!r}: {value!r} needs a 'compressor' "
                             f"({', '.join(_CORE_COMPRESSORS)})")
        # BytePS: fp16 alone is the cast before the local merge, the only compression.
        return FP16Compressor if fp16 else NoneCompressor
    if not isinstance(name, str) or name not in _CORE_COMPRESSORS:
        raise ValueError(f"compression_params: 'compressor': {name!r} is not one of "
                         f"{', '.join(_CORE_COMPRESSORS)}")
    if fp16:
        # BytePS casts to float16 before its compressor; this core compresses float32
        # partitions only, so float16 gradients would silently travel uncompressed.
        raise ValueError(f"compression_params: 'fp16': True does not combine with "
                         f"'compressor': {name!r}: the core compresses float32 gradients "
                         "only; leave 'fp16' out (the compressor sends far fewer bytes "
                         "than float16 would)")
    try:
        return _spec(name, **options)
    except ValueError as error:
        raise ValueError(f"compression_params={dict(params)!r}: {error}") from None


def core_spec(compression, dtype) -> str:
    """The compressor text the core's push_pull gets for a tensor of `dtype`: a
    CoreCompressor's spec for float32, what the core compresses (it decides by size);
    "" otherwise, so such tensors travel whole, as BytePS leaves them."""
    if isinstance(compression, CoreCompressor) and getattr(dtype, "name", None) == "float32":
        return compression.spec
    return ""


class Compression:
    """The compressions a single push_pull takes. Training adds those that work on a
    step's gradients (tf_bps/training/compression.py); bps.Compression is that one."""

    none = NoneCompressor
    fp16 = FP16Compressor

    @staticmethod
    def onebit(scaling: bool = False, ef: str | None = None, momentum: str | None = None,
               mu: float | None = None) -> CoreCompressor:
        """Signs only, one bit per element (BytePS's onebit); `scaling` multiplies them
        by the mean magnitude. `ef="vanilla"`: error feedback; `momentum="nesterov"`."""
        return _spec("onebit", scaling=scaling, ef=ef, momentum=momentum, mu=mu)

    @staticmethod
    def topk(k: float, ef: str | None = None, momentum: str | None = None,
             mu: float | None = None) -> CoreCompressor:
        """The k largest magnitudes of each partition (k below 1: a fraction)."""
        return _spec("topk", k=k, ef=ef, momentum=momentum, mu=mu)

    @staticmethod
    def randomk(k: float, seed: int = 0, ef: str | None = None, momentum: str | None = None,
                mu: float | None = None) -> CoreCompressor:
        """k elements of each partition chosen at random, the same on every worker."""
        return _spec("randomk", k=k, seed=seed, ef=ef, momentum=momentum, mu=mu)

    @staticmethod
    def dithering(k: int, partition: str = "linear", normalize: str = "max", seed: int = 0,
                  ef: str | None = None, momentum: str | None = None,
                  mu: float | None = None) -> CoreCompressor:
        """Stochastic rounding to k levels per sign (linear or natural), of the values
        divided by their max or l2 norm; unbiased."""
        return _spec("dithering", k=k, partition=partition, normalize=normalize, seed=seed,
                     ef=ef, momentum=momentum, mu=mu)

    @staticmethod
    def from_params(params: Mapping) -> Compressor:
        """BytePS's `compression_params` dict, e.g. {"compressor": "topk", "k": 0.01,
        "ef": "vanilla", "momentum": "nesterov", "mu": 0.9}: the same CoreCompressor the
        builders above make (keys compressor, k, scaling, ef, momentum, mu, seed,
        partition, normalize, fp16). Without "compressor": Compression.none, or
        Compression.fp16 with "fp16": True."""
        return _from_params(params)


def name_of(compression) -> str:
    """How messages name a compression: Compression.fp16, or its settings."""
    name = getattr(compression, "__name__", None)
    return f"Compression.{name.removesuffix('Compressor').lower()}" if name else repr(compression)


def from_config(config) -> Compressor | None:
    """The compressor PERSEUS_ALLREDUCE_DTYPE asks for; None when it leaves the choice
    to the code (unset or 1, float32)."""
    if config.wire_dtype in ("float16", "mixed"):
        return ScaledFP16Compressor(config.gradient_scale, config.wire_dtype == "mixed")
    return None
