"""Horovod's start_timeline and stop_timeline at run time. Before init both refuse;
after it, bad arguments are refused naming them. Then push_pulls of g0 (one partition)
and g1 (several) in phases, each phase a step of both: 2 untraced steps, 2 recorded
into one.<rank>.json, 1 untraced, 2 into two.<rank>.json, 2 more after a start that
switches to three.<rank>.json, then stop and 1 untraced. Each file must be whole as
soon as stop_timeline (or the switch's stop) returns: the worker prints WRITTEN <name>
once it parses then. Files go to TEST_TIMELINE_DIR."""

import json
import os
import sys

import tensorflow as tf

import tf_bps as bps
from tf_bps.runtime import basics

folder = os.environ["TEST_TIMELINE_DIR"]


def refused(call, *words) -> None:
    """`call` raises ValueError whose message holds every one of `words`."""
    try:
        call()
    except ValueError as error:
        if all(word in str(error) for word in words):
            return
        sys.exit(f"wrong refusal: {error}")
    sys.exit(f"not refused: {call}")


refused(lambda: basics.start_timeline(os.path.join(folder, "early.json")), "not initialised")
refused(basics.stop_timeline, "not initialised")
bps.init()
rank = bps.rank()
basics.stop_timeline()  # not recording: nothing to do
refused(lambda: basics.start_timeline(""), "file_path")
missing = os.path.join(folder, "missing", "t.json")
refused(lambda: basics.start_timeline(missing), missing, "does not exist")
refused(lambda: basics.start_timeline(os.path.join(folder, "t.json"), mark_cycles="yes"),
        "mark_cycles")
print("REFUSALS OK", flush=True)


def steps(count: int) -> None:
    for _ in range(count):
        for name, elements in (("g0", 10), ("g1", 3000)):
            bps.push_pull(tf.fill([elements], float(rank)), op=bps.Sum, name=name)


def written(name: str) -> None:
    with open(os.path.join(folder, f"{name}.{rank}.json")) as trace:
        json.load(trace)
    print(f"WRITTEN {name}", flush=True)


steps(2)
basics.start_timeline(os.path.join(folder, f"one.{rank}.json"))
steps(2)
basics.stop_timeline()
written("one")
steps(1)
# mark_cycles twice: the note that there are none to mark comes once.
basics.start_timeline(os.path.join(folder, f"two.{rank}.json"), mark_cycles=True)
steps(2)
basics.start_timeline(os.path.join(folder, f"three.{rank}.json"), mark_cycles=True)
written("two")  # nothing of its own ran when it switched: written at once
steps(2)
basics.stop_timeline()
written("three")
steps(1)
print("DONE", flush=True)
bps.shutdown()
