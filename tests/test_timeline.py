"""The communication timeline of a real job: two workers of one host (so their
partitions merge locally) train with DistributedOptimizer, steps 2 and 3 are traced
(BYTEPS_TRACE_*), and both files must be strict Chrome trace JSON whose events nest and
order; and the same from Horovod's start_timeline and stop_timeline at run time."""

import json
import sys
from collections import defaultdict

from harness import LAUNCH, base_env, worker_command

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


def _check_events(events, steps=(2, 3)):
    """Every event is well formed and of `steps`; returns totals by (tensor, step) and
    stages by (tensor, step, partition)."""
    totals, stages = {}, defaultdict(dict)
    for event in events:
        assert set(event) == {"ph", "args", "pid", "name", "ts", "dur", "tid"}, event
        assert event["ph"] == "X" and event["pid"].startswith("Comm."), event
        assert event["args"] == {"name": event["pid"], "step": event["args"]["step"]}, event
        assert all(isinstance(event[k], int) and event[k] >= 0 for k in ("ts", "dur")), event
        step = event["args"]["step"]
        assert step in steps, event  # only the window
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
            if later["name"].endswith((".PULL", ".BROADCAST")):
                # Noted by the thread that reads the answer, which may come in before the
                # sending thread notes when its send ended: the answer's stage then
                # counts from when the send began.
                assert earlier["ts"] <= later["ts"], (earlier, later)
            else:
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


def test_timeline_started_and_stopped_at_run_time(procs, tmp_path):
    """Horovod's start_timeline and stop_timeline (tests/workers/timeline_control.py):
    each file holds exactly the steps recorded into it, each operation with the stages
    of all its partitions, and is whole once stop_timeline (or the start that switched
    files) returned."""
    status, output = procs.run(
        [*LAUNCH, "-np", "2", "--num-servers", "1", *worker_command("timeline_control.py")],
        # The workers merge, so that the merged push (a task of its own at the leader)
        # is recorded with the leader's operation.
        base_env(TEST_TIMELINE_DIR=tmp_path, BYTEPS_LOCAL_MERGE=1, BYTEPS_PARTITION_BYTES=4096,
                 BYTEPS_LOG_LEVEL="INFO"),
        timeout=120)
    assert status == 0, output
    assert output.count("REFUSALS OK") == 2 and output.count("DONE") == 2, output
    for name in ("one", "two", "three"):
        assert output.count(f"WRITTEN {name}") == 2, output
    # mark_cycles=True twice on each worker: the note comes once each.
    assert output.count("no negotiation cycles") == 2, output
    # g0 is one partition, g1 (3000 floats) three; steps 1-2 before, 5 between and 10
    # after the recordings are in no file.
    parts = {"Comm.g0": {"0"}, "Comm.g1": {"0", "1", "2"}}
    for name, steps in (("one", {3, 4}), ("two", {6, 7}), ("three", {8, 9})):
        checked = [_check_recording(_strict_json(tmp_path / f"{name}.{rank}.json"), steps,
                                    parts) for rank in (0, 1)]
        # Each partition merges at one worker of the host (its leader), which pushes it;
        # the other hands its copy over and gets the sum back.
        for key in checked[0]:
            by_rank = sorted((set(stages[key]) for stages in checked), key=len)
            assert by_rank == [{"REDUCE", "BROADCAST"}, {"REDUCE", "QUEUE", "PUSH", "PULL"}], \
                (name, key, by_rank)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        f"{name}.{rank}.json" for name in ("one", "two", "three") for rank in (0, 1))


def _check_recording(trace, steps, parts):
    """The events of one recording: a total for each tensor and step, the stages of
    every partition of each; returns the stages by (tensor, step, partition)."""
    assert set(trace) == {"displayTimeUnit", "traceEvents"}, trace.keys()
    totals, stages = _check_events(trace["traceEvents"], steps)
    assert set(totals) == {(tensor, step) for tensor in parts for step in steps}, totals
    assert set(stages) == {(tensor, step, part) for tensor in parts for step in steps
                           for part in parts[tensor]}, stages
    return stages
