"""How often a server killed at a random moment of synchronous training costs nothing.

    python examples/benchmarks/server_loss_trials.py [--trials 10] [--workers 2] [--servers 3]
        [--json PATH] [--plot PATH]

Each trial starts an elastic job (bpslaunch -np W --min-np W, S servers) whose workers
train without elastic.run: every step push_pulls four 1 MB tensors together (one
tf.function) and checks every element of every sum. Once they have taken 20 steps, one
server, drawn at random, is killed (SIGKILL) at a random moment of the next half second.

A trial ends one of three ways. "no step lost": the workers moved the lost server's
partitions to the others, which finished the interrupted rounds, and every worker ran
all its steps with every sum right. "needs a restore": the server was killed while it
sent a round's answers, some workers had that sum and moved on, and the round failed as
out of step (elastic.run would restore the last commit and re-form). Anything else is
printed and counted as a failure. The script prints each trial and the counts, with the
seconds from the kill to the next step the first worker completed and how many
partitions the workers had in flight at the lost server (sent again elsewhere).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import jobs
import report

STEP = re.compile(r"STEP (\d+) ([\d.]+)")
RESENT = re.compile(r"\((\d+) in flight sent again\)")
ELEMENTS = 250_000  # 1 MB of float32


def worker(steps: int) -> int:
    """One worker: `steps` steps of four push_pulls, every sum checked."""
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    rank, size = bps.rank(), bps.size()

    @tf.function
    def step(scale):
        return [bps.push_pull(tf.fill([ELEMENTS], scale * (rank + 1) * (i + 1)), op=bps.Sum,
                              name=f"trial{i}") for i in range(4)]

    for number in range(steps):
        scale = float(number % 7 + 1)
        for i, total in enumerate(step(tf.constant(scale))):
            expected = scale * (i + 1) * size * (size + 1) / 2
            if not bool(tf.reduce_all(total == expected)):
                print(f"WRONG SUM at step {number}, tensor {i}", flush=True)
                return 2
        print(f"STEP {number} {time.time():.3f}", flush=True)
        time.sleep(0.01)
    bps.shutdown()
    return 0


def trial(workers: int, servers: int, steps: int, draw: random.Random) -> tuple[str, str]:
    """One job, one server killed: (outcome, detail)."""
    command = [sys.executable, "-m", "tf_bps.launch", "-np", str(workers), "--min-np",
               str(workers), "--num-servers", str(servers), sys.executable,
               os.path.abspath(__file__), "--worker", str(steps)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 120
        while not any("STEP 20 " in line for line in lines):
            if time.time() > deadline or job.poll() is not None:
                return "failure", "the job did not reach step 20:\n" + "".join(lines[-20:])
            time.sleep(0.02)
        time.sleep(draw.uniform(0, 0.5))
        victim = draw.choice(jobs.server_pids(job.pid))
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        status = job.wait(timeout=180)
        reader.join(timeout=5)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    output = "".join(lines)
    after = [float(m.group(2)) for m in STEP.finditer(output) if float(m.group(2)) > killed_at]
    resent = sum(int(m.group(1)) for m in RESENT.finditer(output))
    to_next = (f"{min(after) - killed_at:.2f} s to the next step" if after else "no step after") + \
        f", {resent} partition(s) sent again"
    if status == 0 and output.count(f"STEP {steps - 1} ") == workers:
        return "no step lost", to_next
    if "out of step" in output:
        return "needs a restore", to_next
    return "failure", "\n".join(output.splitlines()[-15:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    report.add_arguments(parser)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        return worker(args.worker)
    draw = random.Random(args.seed)
    counts: dict[str, int] = {}
    for number in range(args.trials):
        outcome, detail = trial(args.workers, args.servers, args.steps, draw)
        counts[outcome] = counts.get(outcome, 0) + 1
        print(f"trial {number + 1}: {outcome} ({detail})", flush=True)
    print(f"\n{args.trials} trials, {args.workers} workers, {args.servers} servers, one server "
          "killed at a random moment: " + ", ".join(f"{count} {outcome}"
                                                  for outcome, count in sorted(counts.items())))
    # Higher is better as the question is asked: how many trials lost no step.
    trials = report.Report(f"outcomes of {args.trials} trials, one of {args.servers} servers "
                           f"killed at a random moment, {args.workers} workers", unit="trials",
                           higher_is_better=True)
    for outcome, count in sorted(counts.items()):
        trials.add(f"{args.workers} workers, {args.servers} servers", outcome, count)
    report.save(args, trials)
    return 0 if "failure" not in counts else 1


if __name__ == "__main__":
    sys.exit(main())
