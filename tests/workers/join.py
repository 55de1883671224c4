"""Horovod's join with uneven data: rank 0 has 2 batches, rank 1 has 4. Prints one
REPORT line per rank."""

import json

import tensorflow as tf

import tf_bps as bps

bps.init()
rank = bps.rank()
report = {"rank": rank, "steps": []}
for step in range(2 if rank == 0 else 4):
    summed = bps.allreduce(tf.fill([2], float(rank + 1 + 10 * step)), op=bps.Sum, name="g")
    averaged = bps.allreduce(tf.fill([2], 4.0), name="avg")
    rows = bps.allgather(tf.fill([rank + 1, 1], rank), name="rows")
    report["steps"].append([summed.numpy().tolist(), averaged.numpy().tolist(),
                            rows.numpy().ravel().tolist()])
if rank == 1:
    try:  # Rank 0 has joined: it cannot be a broadcast's root now.
        bps.broadcast(tf.ones([2]), root_rank=0, name="from_joined")
        report["broadcast"] = None
    except tf.errors.InvalidArgumentError as error:
        report["broadcast"] = error.message
report["last"] = int(bps.join())
# Everyone is back in step: the tensors that went on without rank 0 work again.
report["after"] = bps.allreduce(tf.fill([2], float(rank + 1)), op=bps.Sum, name="g").numpy(
    ).tolist()
report["after_rows"] = bps.allgather(tf.fill([rank + 1, 1], rank), name="rows").numpy(
    ).ravel().tolist()
print("REPORT " + json.dumps(report), flush=True)
bps.shutdown()
