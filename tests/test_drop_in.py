"""Scripts written the way Horovod's and BytePS's public TF2 examples (and TensorFlow's
multi-worker Keras tutorial) are written, with tf_bps imported in their place: each runs
under bpslaunch -np 2 and alone, exits 0, and every worker ends with the same trainable
weights, bit for bit. Plus what such scripts rely on beyond the examples."""

import os
import sys

import pytest
from harness import LAUNCH, TESTS, base_env, finish, marked_json, module_job

DROP_IN = TESTS / "workers" / "drop_in"

# (id, script and arguments, extra environment): the public example each one follows.
PATTERNS = [
    # Horovod tensorflow2_mnist.py / BytePS tensorflow2_mnist.py (without its XLA flag).
    ("custom_loop_broadcast_in_function", ["horovod_custom_loop.py"], {}),
    # Horovod tensorflow2_keras_mnist.py.
    ("keras_fit_lazy_model", ["horovod_keras_fit.py"], {}),
    # BytePS tensorflow2_keras_mnist.py: callbacks with device="GPU:0".
    ("byteps_keras_fit_device_arguments", ["horovod_keras_fit.py"], {"BYTEPS_STYLE": "1"}),
    # Horovod tensorflow2_synthetic_benchmark.py.
    ("synthetic_benchmark", ["synthetic_benchmark.py"], {}),
    # BytePS synthetic_benchmark_tf2.py: float64 labels, with fp16 compression.
    ("byteps_synthetic_benchmark_fp16",
     ["synthetic_benchmark.py", "--fp16-allreduce", "--float-labels"], {}),
    # Horovod tensorflow2_keras_synthetic_benchmark.py.
    ("keras_synthetic_benchmark", ["keras_synthetic_benchmark.py"], {}),
    # BytePS tensorflow2_mnist_bps_MirroredStrategy.py.
    ("byteps_mirrored_strategy", ["byteps_mirrored_strategy.py"], {}),
]


def run(procs, tmp_path, args, env, workers):
    command = [sys.executable, str(DROP_IN / args[0]), *args[1:]]
    if workers:
        command = [*LAUNCH, "-np", str(workers), "--", *command]
    env = base_env(PYTHONPATH=str(DROP_IN), DROP_IN_OUT=str(tmp_path), **env)
    status, output = procs.run(command, env, timeout=240)
    assert status == 0, output
    return marked_json(output, "WEIGHTS"), output


# Two of the patterns run on two workers in tests of their own below, which check more.
CHECKED_BELOW = ("custom_loop_broadcast_in_function", "keras_fit_lazy_model")
TWO_WORKERS = [p for p in PATTERNS if p[0] not in CHECKED_BELOW]


@pytest.mark.parametrize("args,env", [p[1:] for p in TWO_WORKERS],
                         ids=[p[0] for p in TWO_WORKERS])
def test_two_workers_end_with_identical_weights(procs, tmp_path, args, env):
    _identical_weights(*run(procs, tmp_path, args, env, workers=2))


def _identical_weights(got, output) -> None:
    assert sorted(got) == [0, 1], output
    assert got[0]["count"] > 0
    assert got[0]["digest"] == got[1]["digest"], output


# Alone (no bpslaunch, push_pull local), the patterns above take one of three paths:
# DistributedGradientTape in a tf.function, DistributedOptimizer under model.fit with
# the callbacks, or the strategy. One pattern of each runs alone.
ALONE = [p for p in PATTERNS if p[0] in ("custom_loop_broadcast_in_function",
                                         "keras_fit_lazy_model", "byteps_mirrored_strategy")]


@pytest.mark.parametrize("args,env", [p[1:] for p in ALONE], ids=[p[0] for p in ALONE])
def test_runs_alone(procs, tmp_path, args, env):
    got, output = run(procs, tmp_path, args, env, workers=None)
    assert sorted(got) == [0], output


def test_custom_loop_pins_by_local_rank_and_saves_on_rank_0(procs, tmp_path):
    got, output = run(procs, tmp_path, ["horovod_custom_loop.py"], {}, workers=2)
    _identical_weights(got, output)
    assert [(got[r]["local_rank"], got[r]["local_size"]) for r in (0, 1)] == [(0, 2), (1, 2)]
    assert any(name.startswith("checkpoints") for name in os.listdir(tmp_path))


def test_keras_fit_checkpoints_on_rank_0(procs, tmp_path):
    _identical_weights(*run(procs, tmp_path, ["horovod_keras_fit.py"], {}, workers=2))
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".keras")) == [
        "checkpoint-1.keras", "checkpoint-2.keras", "checkpoint-3.keras"]


def test_xla_compiled_step_fails_naming_the_op(procs, tmp_path):
    command = [*LAUNCH, "-np", "2", sys.executable, str(DROP_IN / "horovod_custom_loop.py")]
    env = base_env(PYTHONPATH=str(DROP_IN), DROP_IN_JIT="1")
    status, output = procs.run(command, env, timeout=120)
    assert status != 0 and "BytepsPushPull" in output and "XLA" in output, output


def test_multi_worker_tutorial_with_the_strategy(procs, tmp_path):
    # Saving is a step of the whole job: 20 rounds of the tutorial's save-then-load, the
    # chief's writes slowed down, each worker reading the round's weights back.
    got, output = run(procs, tmp_path, ["tf_multi_worker_tutorial.py", str(tmp_path)],
                      {"SAVE_ROUNDS": "20"}, workers=2)
    assert got[0]["digest"] == got[1]["digest"], output
    for rank in (0, 1):
        assert (got[rank]["task_type"], got[rank]["task_id"]) == ("worker", rank)
        assert got[rank]["cluster"] == {"worker": ["127.0.0.1", "127.0.0.1"]}
        assert got[rank]["should_checkpoint"] == got[rank]["should_save_summary"] == (rank == 0)
    # BackupAndRestore and ModelCheckpoint share paths: only rank 0 writes them.
    assert got[0]["writes"] == 4 and got[1]["writes"] == 0, output
    assert sorted(os.listdir(tmp_path / "backup")) == ["latest.weights.h5",
                                                       "training_metadata.json"]
    assert not [n for n in os.listdir(tmp_path) if n.startswith("workertemp")]
    assert (tmp_path / "keras-model.keras").exists() and (tmp_path / "best.weights.h5").exists()
    # TensorBoard: rank 0's run is the job's log; rank 1 wrote to a folder since removed.
    assert sorted(os.listdir(tmp_path / "logs")) == ["train"], output
    [events] = os.listdir(tmp_path / "logs" / "train")
    tags = _scalar_tags(tmp_path / "logs" / "train" / events)
    assert tags.count("epoch_loss") == 2, tags  # one per epoch, from one worker


def _scalar_tags(path) -> list[str]:
    """The summary tags of a TensorBoard event file, read with TensorFlow's own reader."""
    import tensorflow as tf

    tags = []
    for record in tf.data.TFRecordDataset(str(path)):
        event = tf.compat.v1.Event.FromString(record.numpy())
        tags += [value.tag for value in event.summary.value]
    return tags


def test_multi_worker_tutorial_alone(procs, tmp_path):
    got, _ = run(procs, tmp_path, ["tf_multi_worker_tutorial.py", str(tmp_path)], {},
                 workers=None)
    assert (got[0]["task_type"], got[0]["task_id"], got[0]["should_checkpoint"]) == (
        "worker", 0, True)


@module_job
def surface(processes, _):
    command = [*LAUNCH, "-np", "2", sys.executable, str(DROP_IN / "api_surface.py")]
    status, output = processes.run(command, base_env(PYTHONPATH=str(DROP_IN),
                                                     BYTEPS_LOG_LEVEL="INFO"), timeout=180)
    assert status == 0, output
    got = marked_json(output)
    assert sorted(got) == [0, 1], output
    return got, output


def test_constant_inputs_are_never_folded_or_merged(surface):
    got, _ = surface
    for report in got.values():
        assert report["broadcast_constant"] == [10, 20, 30]
        assert report["twins"] == [[2.0, 4.0], [2.0, 4.0]]
        assert "BytepsPushPull" in report["jit"] or report["jit"] == "ran"


def test_module_surfaces_and_placement(surface):
    got, output = surface
    for rank, report in got.items():
        assert report["missing"] == []
        assert (report["local_rank"], report["local_size"]) == (rank, 2)
        assert (report["cross_rank"], report["cross_size"]) == (0, 1)


def test_logging_leaves_the_root_logger_to_the_user_and_reaches_their_handlers(surface):
    got, output = surface
    assert output.count("USERLOG user configured by the script") == 2
    for report in got.values():
        assert report["root_handlers"] == 1 and report["tf_bps_propagates"] is True
    # tf_bps's records go through the user's handler, once, and not through ours too.
    for rank in range(2):
        assert output.count(f"USERLOG tf_bps worker rank {rank} of 2 joined") == 1, output
    assert "INFO] worker rank 0 of 2 joined" not in output, output


def test_allreduce_with_horovods_arguments(surface):
    got, _ = surface
    for report in got.values():
        assert report["allreduce_default"] == [1.5] * 4
        assert report["allreduce_sum"] == report["allreduce_average_false"] == [3.0] * 4
        assert report["allreduce_scaled"] == [3.0] * 4  # (2*1 + 2*2) * 0.5
        assert report["allreduce_global_set"] == [1.5] * 4
        assert report["allreduce_sparse"] == [[0.0, 0.5], [0, 1]]


def test_keyword_arguments_are_honoured_or_refused_by_name(surface):
    got, _ = surface
    for report in got.values():
        for call, message in report["refusals"].items():
            argument = call.split(" ", 1)[1].split(" ")[0]
            assert message and argument in message, (call, message)
        assert report["optimizer_every_argument"] == [-1.5, -1.5]
        assert report["optimizer_passes_sum"] == [-3.0, -3.0]  # Horovod's default: a sum.
        assert report["optimizer_passes_mean"] == [-1.5, -1.5]
        assert report["tape_every_argument"] == [3.0, 3.0]
    # A registered local variable keeps its own gradient (rank + 1), scaled by 1/size.
    assert [got[r]["optimizer_local_var"] for r in (0, 1)] == [[-0.5, -0.5], [-1.0, -1.0]]
    assert [got[r]["optimizer_local_unscaled"] for r in (0, 1)] == [[-1.0, -1.0], [-2.0, -2.0]]
    assert [got[r]["tape_local_sparse"] for r in (0, 1)] == [
        ["IndexedSlices", [[0.5, 0.5]]], ["IndexedSlices", [[1.0, 1.0]]]]


def test_load_model_restores_a_distributed_optimizer(surface):
    got, _ = surface
    for report in got.values():
        assert report["loaded_class"] == ["Adam", "_DistributedKerasOptimizer"]
        assert report["loaded_iterations"] == 1
    # Different data per rank, yet the same update: the loaded optimizer synchronises.
    assert got[0]["loaded_weights"] == got[1]["loaded_weights"]


def test_bpslaunch_accepts_a_separator(procs):
    status, output = procs.run([*LAUNCH, "-np", "1", "--", sys.executable, "-c",
                                "print('separated')"], base_env(), timeout=60)
    assert status == 0 and "separated" in output, output


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if marker.encode() in environ.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("command", [["no-such-program-xyz"], ["./no/such/file.sh"]],
                         ids=["missing_program", "missing_file"])
def test_bpslaunch_command_that_cannot_start(procs, command):
    marker = f"BPS_TEST_MARKER_{os.getpid()}_{len(command[0])}"
    status, output = procs.run([*LAUNCH, "-np", "2", "--", *command],
                               base_env(**{marker: "1"}), timeout=60)
    assert status == 127, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("bpslaunch: cannot run"), output
    assert _processes_with(marker) == []


def test_bpslaunch_missing_script_ends_the_whole_job(procs):
    marker = f"BPS_TEST_MARKER_{os.getpid()}_script"
    status, output = procs.run([*LAUNCH, "-np", "2", "--", sys.executable, "missing_script.py"],
                               base_env(**{marker: "1"}), timeout=60)
    assert status != 0 and "bpslaunch: worker" in output, output
    assert _processes_with(marker) == []


def test_local_rank_with_byteps_variables(procs):
    """Workers started by BytePS's variables (DMLC_ROLE, DMLC_WORKER_ID), not by -np:
    placement.py, which imports no TensorFlow, reports the local rank and size they
    worked out together (api_surface.py's run above reports them under -np)."""
    job = procs.start_job_by_role(2, 1, "placement.py")
    reports = {}
    for label, process in job.items():
        status, output = finish(process, timeout=180)
        assert status == 0, f"{label}: {output}"
        reports.update(marked_json(output))
    assert [(reports[r]["local_rank"], reports[r]["local_size"]) for r in (0, 1)] == [
        (0, 2), (1, 2)]


