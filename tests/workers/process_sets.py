"""Process sets with 3 workers: ranks 0 and 2 form `even`, rank 1 alone `odd`.
Prints one REPORT line per rank for the test to check."""

import json
import time

import tensorflow as tf

import tf_bps as bps

even = bps.ProcessSet([2, 0])
bps.init(process_sets=[even])
rank = bps.rank()
report = {"rank": rank}
odd = bps.add_process_set([1])
report["ids"] = [even.process_set_id, odd.process_set_id]
report["sizes"] = [even.size(), odd.size(), bps.global_process_set.size()]
report["included"] = [even.included(), odd.included()]
report["even_rank"] = even.rank() if even.included() else None
for label, call in {"duplicate": lambda: bps.add_process_set([0, 2]),
                    "out_of_range": lambda: bps.add_process_set([0, 5]),
                    "bad_root": lambda: bps.broadcast(tf.ones([2]), 1, process_set=even)}.items():
    try:
        call()
        report[label] = None
    except ValueError as error:
        report[label] = str(error)

value = tf.fill([3], float(rank + 1))
if even.included():
    report["sum"] = bps.allreduce(value, op=bps.Sum, process_set=even).numpy().tolist()
    report["average"] = tf.function(lambda t: bps.allreduce(t, process_set=even))(
        value).numpy().tolist()
    report["unnamed"] = bps.push_pull(value, op=bps.Sum, process_set=even).numpy().tolist()
    report["broadcast"] = bps.broadcast(value, 2, process_set=even).numpy().tolist()
    report["allgather"] = bps.allgather(tf.fill([rank + 1, 1], rank), process_set=even).numpy(
        ).ravel().tolist()
    received, splits = bps.alltoall(tf.constant([[rank * 10], [rank * 10 + 1], [rank * 10 + 2]]),
                                    splits=[1, 2], process_set=even)
    report["alltoall"] = [received.numpy().ravel().tolist(), splits.numpy().tolist()]
    report["reducescatter"] = bps.reducescatter(tf.ones([3, 2]) * (rank + 1), op=bps.Sum,
                                                process_set=even).numpy().tolist()
    report["objects"] = bps.allgather_object(f"r{rank}", process_set=even)
    # A sparse gradient stays sparse in a set: the set's rows, averaged over its size.
    sparse = bps.allreduce(tf.IndexedSlices(tf.fill([1, 2], float(rank)), tf.constant([rank])),
                           process_set=even)
    report["sparse"] = [type(sparse).__name__, sparse.values.numpy().tolist(),
                        sparse.indices.numpy().tolist()]
else:
    try:
        bps.allreduce(value, process_set=even)
        report["outsider"] = None
    except tf.errors.InvalidArgumentError as error:
        report["outsider"] = error.message
    report["alone"] = bps.allreduce(value, op=bps.Sum, process_set=odd).numpy().tolist()

# Gradients reduce over the set; outside it they stay local (Horovod's behaviour).
variable = tf.Variable([1.0, 2.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(variable * float((rank + 1) ** 2))
tape = bps.DistributedGradientTape(tape, process_set=even)
report["tape"] = tape.gradient(loss, variable).numpy().tolist()
# Barriers: nobody leaves before the slowest member arrives.
if rank == 2:
    time.sleep(1.0)
started = time.monotonic()
if even.included():
    bps.barrier(process_set=even)
bps.barrier()
report["barrier_wait"] = time.monotonic() - started
# Every worker together again, then the sets go away and an id is reused.
report["global"] = bps.allreduce(value, op=bps.Sum).numpy().tolist()
report["removed"] = [bps.remove_process_set(even), bps.remove_process_set(even),
                     bps.remove_process_set(bps.global_process_set)]
report["reused_id"] = bps.add_process_set([0, 1]).process_set_id
print("REPORT " + json.dumps(report), flush=True)
bps.shutdown()
