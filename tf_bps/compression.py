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


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
