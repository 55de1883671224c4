"""The examples run under bpslaunch and alone, and training converges."""

import re
import sys

from conftest import TESTS, base_env

EXAMPLES = TESTS.parent / "examples"


def run_example(procs, name, *args, workers=None):
    command = [sys.executable, str(EXAMPLES / name), *args]
    if workers:
        command = [sys.executable, "-m", "tf_bps.launch", "-np", str(workers), *command]
    status, output = procs.run(command, base_env(), timeout=240)
    assert status == 0, output
    return output


def test_strategy_example_converges_with_two_workers(procs):
    output = run_example(procs, "keras_mnist_strategy.py", "--epochs", "3", workers=2)
    assert "2 worker(s), 2 replica(s)" in output
    found = re.search(r"\[0\]: final train loss ([\d.]+), test loss ([\d.]+), "
                      r"test accuracy ([\d.]+)", output)
    assert found, output
    train_loss, _, accuracy = map(float, found.groups())
    assert train_loss < 0.5 and accuracy > 0.9, output
    assert "[1]: final" not in output  # Only rank 0 reports.


def test_distributed_optimizer_example(procs):
    output = run_example(procs, "keras_mnist_distributed_optimizer.py", "--epochs", "3",
                         workers=2)
    found = re.search(r"test accuracy ([\d.]+)", output)
    assert found and float(found.group(1)) > 0.9, output
    output = run_example(procs, "keras_mnist_distributed_optimizer.py", "--epochs", "1")
    assert "1 worker(s)" in output and "test accuracy" in output


def test_gradient_tape_example(procs):
    output = run_example(procs, "custom_loop_gradient_tape.py", "--steps", "120", workers=2)
    losses = [float(v) for v in re.findall(r"\[0\]: step \d+: loss ([\d.]+)", output)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 2, output
    output = run_example(procs, "custom_loop_gradient_tape.py", "--steps", "20")
    assert "step 19" in output
