"""The communication timeline (BYTEPS_TRACE_*) of a real job: two workers of one host
(so their partitions merge locally) train with DistributedOptimizer, steps 2 and 3 are
traced, and both files must be strict Chrome trace JSON whose events nest and order."""

import json
import sys
from collections import defaultdict

from conftest import LAUNCH, base_env, worker_command

STAGES = ["REDUCE", "QUEUE", "PUSH", "PULL", "BROADCAST"]  # in the order a partition meets them


def _strict_json(path):
    def no_repeats(pairs):
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), f"repeated keys in {path}: {keys}"
        return dict(pairs)

    def no_constants(name):
        raise AssertionError(f"{name} in {path}")

    with open(path) as trace:
        return json.load(trace, object_pairs_hook=no_repeats, parse_constant=no_constants)


def _check_events(events):
    """Every event is well formed; returns totals by (tensor, step) and stages by
    (tensor, step, partition)."""
    totals, stages = {}, defaultdict(dict)
    for event in events:
        assert set(event) == {"ph", "args", "pid", "name", "ts", "dur", "tid"}, event
        assert event["ph"] == "X" and event["pid"].startswith("Comm."), event
        assert event["args"] == {"name": event["pid"], "step": event["args"]["step"]}, event
        assert all(isinstance(event[k], int) and event[k] >= 0 for k in ("ts", "dur")), event
        step = event["args"]["step"]
        assert step in (2, 3), event  # only the window
        if event["tid"] == "total":
            assert event["name"] == event["pid"], event
            assert (event["pid"], step) not in totals, event
            totals[event["pid"], step] = event
        else:
            stage = event["name"][len(event["pid"]) + 1:]
            assert event["name"] == f"{event['pid']}.{stage}" and stage in STAGES, event
            assert event["tid"].isdigit(), event
            stages[event["pid"], step, event["tid"]][stage] = event
    for (tensor, step, _), by_stage in stages.items():
        total = totals[tensor, step]  # every stage belongs to a traced operation...
        chain = [by_stage[stage] for stage in STAGES if stage in by_stage]
        for event in chain:  # ...lies within it...
            assert total["ts"] <= event["ts"], (total, event)
            assert event["ts"] + event["dur"] <= total["ts"] + total["dur"], (total, event)
        for earlier, later in zip(chain, chain[1:], strict=False):  # ...and follows the one before
            assert earlier["ts"] + earlier["dur"] <= later["ts"], (earlier, later)
    return totals, stages


def test_timeline_of_two_workers_training(procs, tmp_path):
    status, output = procs.run(
        [*LAUNCH, "-np", "2", *worker_command("traced_training.py")],
        # Each gradient its own round (no fusion), so that each has its own events; the
        # workers merge although their servers are on their host, for the merge's stages.
        base_env(BYTEPS_TRACE_ON=1, BYTEPS_TRACE_START_STEP=2, BYTEPS_TRACE_END_STEP=3,
                 BYTEPS_TRACE_DIR=tmp_path, BYTEPS_FUSION_THRESHOLD=0, BYTEPS_LOCAL_MERGE=1),
        timeout=180)
    assert status == 0, output
    # Each file was complete while its worker still ran (before shutdown).
    assert "[0]: TRACE WRITTEN" in output and "[1]: TRACE WRITTEN" in output, output
    files = [_strict_json(tmp_path / str(local_rank) / "comm.json") for local_rank in (0, 1)]
    checked = [_check_events(trace["traceEvents"]) for trace in files]
    gradients = {f"Comm.DistributedOptimizer.sequential/{layer}/{kind}"
                 for layer in ("dense", "dense_1") for kind in ("kernel", "bias")}
    for totals, _ in checked:  # the same stable names on both workers, both steps
        assert set(totals) == {(name, step) for name in gradients for step in (2, 3)}, totals
    # The workers merge each partition locally: exactly one of them (its leader) pushes
    # it to the server, and the other waits for the leader's result.
    partitions = set(checked[0][1]) | set(checked[1][1])
    assert len(partitions) >= len(gradients) * 2, partitions  # one or more per tensor and step
    for key in partitions:
        pushed = [("PUSH" in stages.get(key, {})) for _, stages in checked]
        assert sorted(pushed) == [False, True], (key, checked[0][1].get(key),
                                                 checked[1][1].get(key))
        other = checked[pushed.index(False)][1][key]
        assert set(other) == {"REDUCE", "BROADCAST"}, other


def test_a_window_that_ends_before_it_starts_is_refused(procs):
    status, output = procs.run(
        [sys.executable, "-c", "import tf_bps; tf_bps.init()"],
        base_env(BYTEPS_TRACE_ON=1, BYTEPS_TRACE_START_STEP=5, BYTEPS_TRACE_END_STEP=4),
        timeout=60)
    assert status != 0 and "BYTEPS_TRACE_END_STEP=4 is not valid: it comes before " \
        "BYTEPS_TRACE_START_STEP=5" in output, output
