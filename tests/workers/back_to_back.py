"""Back-to-back rounds of the same tensors, as fast as each worker can go: every
result must be its own round's. Same-host workers and servers share memory, written
again round after round and freed when a shape changes, so a worker that races ahead
must never overwrite what a slower one is still reading, and freed memory must never
be reused under a reader. Exits non-zero at the first wrong value."""

import os
import sys

import numpy as np
import tensorflow as tf

import tf_bps as bps

# Workers listed in TEST_TCP_WORKERS use TCP, the others shared memory.
if os.environ["HOROVOD_RANK"] in os.environ.get("TEST_TCP_WORKERS", "").split(","):
    os.environ["BYTEPS_ENABLE_IPC"] = "0"
bps.init()
rank, size = bps.rank(), bps.size()
rounds = int(os.environ.get("TEST_ROUNDS", "40"))
elements = 2 * 1024 * 1024  # 8 MB of float32: many partitions, and slow to read


def check(what: str, round_: int, got: np.ndarray, want: np.ndarray) -> None:
    if not np.array_equal(got, want):
        wrong = np.flatnonzero(got.ravel() != want.ravel())
        print(f"WRONG {what} round {round_} on rank {rank}: {wrong.size} values differ, "
              f"first {got.ravel()[wrong[0]]} where {want.ravel()[wrong[0]]} was due",
              flush=True)
        sys.exit(1)


# Each kind back to back, so that the fastest worker is at most one round ahead.
for i in range(rounds):
    # Mostly the same root, so that it pushes round after round into the same slots.
    root = 0 if i % 4 else i // 4 % size
    got = bps.broadcast(tf.fill([elements], float(1000 * i + rank)), root_rank=root,
                        name="b2b.broadcast")
    check("broadcast", i, got.numpy(), np.full(elements, 1000.0 * i + root, np.float32))
for i in range(rounds):
    # Row counts change with the round, so slots move as well as get reused.
    rows = [1 + (i + r) % 3 for r in range(size)]
    got = bps.allgather(tf.fill([rows[rank] * 4096, 128], float(10 * i + rank)),
                        name="b2b.allgather")
    want = np.concatenate([np.full((rows[r] * 4096, 128), 10.0 * i + r, np.float32)
                           for r in range(size)])
    check("allgather", i, got.numpy(), want)
for i in range(rounds):
    got = bps.push_pull(tf.fill([elements], float(i + rank)), average=False, name="b2b.sum")
    check("push_pull", i, got.numpy(), np.full(elements, float(size * i + sum(range(size))),
                                                np.float32))
# Shapes that change by more than 4x from round to round, so that slots move and the
# old ones are freed while a slower worker may still be at the round before: whatever
# reuses their memory must never show in a result.
SIZES = [elements, 1000, elements // 2, 7, elements // 8, elements]
for i in range(rounds):
    n = SIZES[i % len(SIZES)]
    got = bps.push_pull(tf.fill([n], float(i + rank)), average=False, name="b2b.moving.sum")
    check("push_pull of a changing shape", i, got.numpy(),
          np.full(n, float(size * i + sum(range(size))), np.float32))
    root = i % size
    got = bps.broadcast(tf.fill([SIZES[(i + 1) % len(SIZES)]], float(100 * i + rank)),
                        root_rank=root, name="b2b.moving.broadcast")
    check("broadcast of a changing shape", i, got.numpy(),
          np.full(SIZES[(i + 1) % len(SIZES)], 100.0 * i + root, np.float32))
print("DONE", rank, flush=True)
bps.shutdown()
