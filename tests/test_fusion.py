"""The fusion plans (tf_bps/training/fusion.py): which tensors share a buffer, under which name,
and that unfusing gives every tensor back."""

import numpy as np
import tensorflow as tf

from tf_bps.training import fusion


def test_small_tensors_share_buffers_per_dtype_up_to_the_bucket_size():
    tensors = [tf.fill([10], 1.0), tf.fill([100_000], 2.0), tf.fill([2, 3], 3.0),
               tf.fill([4], 4), tf.fill([5], 5.0), tf.fill([3], 6.0)]
    names = [f"t{i}" for i in range(len(tensors))]
    # Under 1000 bytes is small; a bucket holds at most 64 bytes: t0 (40) + t2 (24),
    # then t4 (20) + t5 (12); the int32 t3 goes alone, the big t1 too.
    sent, sent_names, unfuse = fusion.fuse_small(tensors, names, threshold=1000,
                                                 bucket_bytes=64)
    assert sent_names == ["t0.fused2", "t1", "t3", "t4.fused2"]
    assert [t.shape.num_elements() for t in sent] == [16, 100_000, 4, 8]
    for original, back in zip(tensors, unfuse(sent), strict=True):
        np.testing.assert_array_equal(back.numpy(), original.numpy())
        assert back.shape == original.shape and back.dtype == original.dtype


def test_a_zero_threshold_fuses_nothing():
    tensors = [tf.ones([2]), tf.ones([3])]
    sent, names, _ = fusion.fuse_small(tensors, ["a", "b"], threshold=0, bucket_bytes=1 << 20)
    assert names == ["a", "b"] and sent == tensors
