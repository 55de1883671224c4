"""Gradient compression applied around push_pull (Horovod's Compression API)."""

from __future__ import annotations


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


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor

    @staticmethod
    def powersgd(rank: int = 1, start_iter: int = 1000, min_compression_rate: float = 2.0,
                 use_error_feedback: bool = True, warm_start: bool = True, seed: int = 0):
        """Low-rank compression (PowerSGD, as PyTorch's powerSGD_hook) of gradients of
        rank >= 2: see tf_bps/training/powersgd.py. The object keeps each gradient's
        state from step to step: make it once and pass it to every step's tape."""
        from tf_bps.training.powersgd import PowerSGD

        return PowerSGD(rank, start_iter, min_compression_rate, use_error_feedback,
                        warm_start, seed)


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
