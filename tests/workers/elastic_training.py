"""Trains inside elastic.run in a job that may lose and gain workers: each step
push_pulls ones (their sum is the job's size, checked) and adds 1 to a weight; commits
every 5 steps. Prints RESET lines as the job re-forms and a REPORT at the end: rank,
size, steps, the weight, resets and the sizes seen.

ELASTIC_DIE="1@20,2@40": the worker bpslaunch started as rank 1 exits with status 1
at its step 20, rank 2 at step 40; with a discovery script, workers are named by host
("127.0.0.1@20").
ELASTIC_FINISH_AT_SIZE=2: the last 5 steps wait, committing, until the job has 2 workers
again (one that comes back takes however long its start takes)."""

import json
import os
import sys
import time

import tensorflow as tf

import tf_bps as bps
import tf_bps.elastic as elastic

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 60
PAUSE = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05

bps.init()
weight = tf.Variable(0.0)
state = elastic.TensorFlowState([weight], step=0)
seen = []
NAME = os.environ.get("HOROVOD_RANK") or os.environ.get("HOROVOD_HOSTNAME")
DIES_AT = dict(item.split("@") for item in os.environ.get("ELASTIC_DIE", "").split(",")
               if item).get(NAME)
FINISH_AT_SIZE = int(os.environ.get("ELASTIC_FINISH_AT_SIZE", "0"))


def on_reset():
    print(f"RESET rank {bps.rank()} size {bps.size()} step {state.step}", flush=True)


state.register_reset_callbacks([on_reset])
# run() restores after a lost peer and syncs after a change that added workers; a
# host that leaves costs neither. (A sync restores what it received, so it counts in
# both lists.)
restores, syncs = [], []
restore, sync = state.restore, state.sync
state.restore = lambda: (restores.append(state.step), restore())
state.sync = lambda: (syncs.append(state.step), sync())
# A preemption notice (SIGTERM) makes this worker leave at a commit: it says where.
elastic.on_preemption(lambda state: print(f"PREEMPTED rank {bps.rank()} step {state.step} "
                                          f"weight {float(weight.numpy())}", flush=True))
print(f"READY rank {bps.rank()} pid {os.getpid()}", flush=True)


@elastic.run
def train(state):
    while state.step < STEPS:
        if state.step == STEPS - 5 and bps.size() < FINISH_AT_SIZE:
            state.commit()  # where a worker that joins is taken in
            time.sleep(PAUSE)
            continue
        total = bps.push_pull(tf.ones([1000]), op=bps.Sum, name="elastic_training")
        size = bps.size()
        if float(total[0]) != size or float(total[-1]) != size:
            raise AssertionError(f"rank {bps.rank()}: a sum of {float(total[0])} in a job "
                                 f"of {size} at step {state.step}")
        if not seen or seen[-1] != size:
            seen.append(size)
        weight.assign_add(1.0)
        state.step += 1
        if DIES_AT is not None and state.step == int(DIES_AT):
            print(f"DYING at step {state.step}", flush=True)
            os._exit(1)
        if state.step % 5 == 0:
            state.commit()
            print(f"COMMIT rank {bps.rank()} step {state.step}", flush=True)
        time.sleep(PAUSE)


resets = []
state.register_reset_callbacks([lambda: resets.append(bps.size())])
train(state)
print("REPORT " + json.dumps({"rank": bps.rank(), "size": bps.size(), "step": state.step,
                              "host": os.environ.get("HOROVOD_HOSTNAME"),
                              "weight": float(weight.numpy()), "sizes": seen,
                              "resets": resets, "restores": len(restores) - len(syncs),
                              "syncs": len(syncs)}), flush=True)
bps.shutdown()
