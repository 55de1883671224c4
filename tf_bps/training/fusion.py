"""Tensor fusion: a step's gradients packed into fewer buffers, each synchronised as one
push_pull and unpacked after, so that many small tensors cost a few rounds instead of
one each. Tensors of one dtype and a fully known shape share buffers; others travel
alone. Two plans:
    fuse        AIACC's PERSEUS_ALLREDUCE_FUSION=N: every gradient, in the model's
                order, in about N buffers of similar size.
    fuse_small  the default (BYTEPS_FUSION_THRESHOLD): only tensors smaller than the
                threshold share buffers, of at most one partition each; larger ones
                are already cut into partitions and spread over the servers.
"""

from __future__ import annotations

import tensorflow as tf


def fuse(tensors: list, names: list[str], parts: int):
    """(the tensors to send, their names, a function turning their results back into
    one result per input tensor)."""
    total = sum(_bytes(t) for t in tensors if t.shape.is_fully_defined())
    target = max(1, total // max(1, parts))
    buckets: list[list[int]] = []
    current: list[int] = []
    for index, tensor in enumerate(tensors):
        if not tensor.shape.is_fully_defined():
            buckets.append([index])
            continue
        if current and (tensor.dtype != tensors[current[0]].dtype
                        or sum(_bytes(tensors[i]) for i in current) >= target):
            buckets.append(current)
            current = []
        current.append(index)
    if current:
        buckets.append(current)
    return _pack(tensors, names, buckets)


def fuse_small(tensors: list, names: list[str], threshold: int, bucket_bytes: int):
    """Like fuse(), packing only tensors under `threshold` bytes, per dtype, into buffers
    of at most `bucket_bytes`; each buffer goes where its first tensor stood."""
    buckets: list[list[int]] = []
    open_bucket: dict[tf.DType, tuple[list[int], int]] = {}  # dtype -> (bucket, bytes)
    for index, tensor in enumerate(tensors):
        small = tensor.shape.is_fully_defined() and _bytes(tensor) < threshold
        if not small:
            buckets.append([index])
            continue
        bucket, filled = open_bucket.get(tensor.dtype, (None, 0))
        if bucket is None or filled + _bytes(tensor) > bucket_bytes:
            bucket, filled = [], 0
            buckets.append(bucket)
        bucket.append(index)
        open_bucket[tensor.dtype] = (bucket, filled + _bytes(tensor))
    return _pack(tensors, names, buckets)


def _pack(tensors: list, names: list[str], buckets: list[list[int]]):
    sent, sent_names = [], []
    for bucket in buckets:
        if len(bucket) == 1:
            sent.append(tensors[bucket[0]])
            sent_names.append(names[bucket[0]])
        else:
            sent.append(tf.concat([tf.reshape(tensors[i], [-1]) for i in bucket], 0))
            # Stable across steps and workers: the first tensor's name and the count.
            sent_names.append(f"{names[bucket[0]]}.fused{len(bucket)}")

    def unfuse(results: list) -> list:
        out = [None] * len(tensors)
        for bucket, result in zip(buckets, results, strict=True):
            if len(bucket) == 1:
                out[bucket[0]] = result
                continue
            pieces = tf.split(result, [tensors[i].shape.num_elements() for i in bucket])
            for i, piece in zip(bucket, pieces, strict=True):
                out[i] = tf.reshape(piece, tensors[i].shape)
        return out

    return sent, sent_names, unfuse


def _bytes(tensor) -> int:
    return tensor.shape.num_elements() * tensor.dtype.size
