"""Run with the Bazel-built libraries in place of the pip-built ones (see
test_bazel.py): prints REPORT {json} with where the core and the kernels were loaded
from, the devices push_pull has kernels for, and a push_pull's result."""

import json

import tensorflow as tf
from tensorflow.python.framework import kernels

import tf_bps as bps
from tf_bps.runtime import core

bps.init()
summed = bps.push_pull(tf.fill([1000], float(bps.rank() + 1)), op=bps.Sum, name="bazel")
loaded = [line.split()[-1] for line in open("/proc/self/maps")
          if "_bps_core" in line or "_bps_tf_ops" in line]
print("REPORT " + json.dumps({"rank": bps.rank(), "sum": float(summed[0]),
                              "kernels": str(core.native_library("_bps_tf_ops")),
                              "mapped": sorted(set(loaded)),
                              "push_pull_devices": sorted({k.device_type for k in
                                                           kernels.get_registered_kernels_for_op(
                                                               "BytepsPushPull").kernel})}),
      flush=True)
