"""How much of the device copies of traced push_pulls the network hides, from a
timeline (BYTEPS_TRACE_ON; custom_ops/worker/timeline.h): for each traced operation on
device memory, the share of its copy time (COPY_IN, COPY_OUT) during which one of its
partitions was on the network (PUSH, PULL). tools/gpu_check.sh reports it.

A copy's event runs from when it was queued to when it ended, and a stream runs its
copies one at a time, so each copy is taken to run from the later of its queueing and
the end of the copy before it on the stream (copies in, then copies out, in the order
they ended).

    python tools/copy_overlap.py TRACE_DIR [TENSOR]

prints {"copy_ms": ..., "hidden": ...} as JSON: the copy time of the traced operations
(on TENSOR only, if named), and the share of it hidden."""

import json
import sys
from collections import defaultdict
from pathlib import Path


def _serial(events):
    """(start, end) of each copy, one at a time in the order they ended."""
    spans, free_at = [], 0
    for begin, end in sorted(((e["ts"], e["ts"] + e["dur"]) for e in events),
                             key=lambda span: span[1]):
        start = max(begin, free_at)
        spans.append((min(start, end), end))
        free_at = end
    return spans


def union(spans):
    """The spans' union: sorted, overlapping ones merged."""
    merged = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    return merged


def _overlap(span, merged):
    begin, end = span
    return sum(max(0, min(end, b) - max(begin, a)) for a, b in merged)


def copy_overlap(trace_dir: Path, tensor: str | None = None) -> dict:
    """Copy time (ms) and the share of it hidden, over the traced operations (on
    `tensor` only, if given)."""
    operations = defaultdict(lambda: defaultdict(list))
    for path in sorted(Path(trace_dir).rglob("*.json")):
        for event in json.loads(path.read_text())["traceEvents"]:
            if event["tid"] == "total" or (tensor and event["pid"] != "Comm." + tensor):
                continue
            stage = event["name"].rsplit(".", 1)[1]
            operations[path, event["pid"], event["args"]["step"]][stage].append(event)
    copy_us = hidden_us = 0
    for stages in operations.values():
        network = union((e["ts"], e["ts"] + e["dur"])
                         for stage in ("PUSH", "PULL") for e in stages.get(stage, []))
        for stage in ("COPY_IN", "COPY_OUT"):
            for span in _serial(stages.get(stage, [])):
                copy_us += span[1] - span[0]
                hidden_us += _overlap(span, network)
    return {"copy_ms": round(copy_us / 1000, 3),
            "hidden": round(hidden_us / copy_us, 3) if copy_us else None}


if __name__ == "__main__":
    print(json.dumps(copy_overlap(Path(sys.argv[1]), *sys.argv[2:3])))
