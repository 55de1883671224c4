"""Ops inside one tf.function: on different tensors they do not wait for each other
(rank 0 builds A then B, the others B then A; were each op to wait for the previous one,
as TensorFlow's automatic control dependencies would make them, this deadlocks until
the operation timeout), and on one tensor name they run as rounds in program order.
Prints REPORT {json} per rank."""

import json

import tensorflow as tf

import tf_bps as bps

bps.init()
rank = bps.rank()


@tf.function
def crossed(a, b):
    if rank == 0:
        return bps.push_pull(a, name="A", op=bps.Sum), bps.push_pull(b, name="B", op=bps.Sum)
    summed_b = bps.push_pull(b, name="B", op=bps.Sum)
    return bps.push_pull(a, name="A", op=bps.Sum), summed_b


@tf.function
def same_name_twice(a, b):
    first = bps.push_pull(a, name="same", op=bps.Sum)
    second = bps.push_pull(b, name="same", op=bps.Sum)
    return first, second


report = {"rank": rank}
sum_a, sum_b = crossed(tf.fill([3], float(rank + 1)), tf.fill([5], 10.0 * (rank + 1)))
report["crossed"] = [sum_a.numpy().tolist(), sum_b.numpy().tolist()]
for step in range(3):
    first, second = same_name_twice(tf.fill([4], float(rank + step)),
                                    tf.fill([4], 100.0 * (rank + step)))
    report[f"same{step}"] = [first.numpy().tolist(), second.numpy().tolist()]
print("REPORT " + json.dumps(report), flush=True)
