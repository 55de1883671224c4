"""How fast an elastic job comes back: model.fit inside tf_bps.elastic.run on worker
hosts a discovery script lists (bpslaunch --host-discovery-script), through faults.

    python examples/benchmarks/elastic_benchmark.py [--hosts 4] [--batches-per-commit 5]
        [--json PATH] [--plot PATH]

The job starts on --hosts hosts (127.0.0.1, 127.0.0.2, ...: this machine under several
names, one worker each) with 2 servers; then, in turn, a worker is killed (SIGKILL), a
server is killed, a worker is frozen (SIGSTOP, found only by its silence:
PS_HEARTBEAT_TIMEOUT), and a host is added to the discovery script's list. For each
fault the script prints the seconds from the fault to the next completed step of the
re-formed job (a lost server: to its next step, as the job goes on in its generation),
the steps lost (trained before the fault, beyond the commit the job went back to),
whether the job re-formed, and the median step time before and after.

The peer is what a job without elastic training does after losing a worker: start
again. It is measured in the same run as the seconds from `bpslaunch -np N` to the
first completed step of a fresh job of the same model (before any checkpoint is even
read back).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import jobs
import report

# pid, size, re-formings so far, the job's step, time
STEP = re.compile(r"STEP (\d+) (\d+) (\d+) (\d+) ([\d.]+)")
BATCHES, FEATURES = 64, 256


def worker() -> None:
    """One worker: a dense model trained with model.fit for ever, printing a STEP line
    each batch and a PID line at the start."""
    import keras
    import numpy as np

    import tf_bps.keras as bps

    bps.init()
    commit_every = int(os.environ["BENCH_BATCHES_PER_COMMIT"])
    steps_per_epoch = 50
    print(f"PID {os.getpid()} {os.environ.get('HOROVOD_HOSTNAME', '')}", flush=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCHES * steps_per_epoch, FEATURES)).astype("float32")
    y = rng.integers(0, 10, size=(BATCHES * steps_per_epoch,))
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1024, "relu"),
                              keras.layers.Dense(1024, "relu"), keras.layers.Dense(10)])
    model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # `step` counts the steps of the job; it goes back to the last commit on a restore.
    state = bps.elastic.KerasState(model, batch=0, epoch=0, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(1)])

    class Stamp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            state.step += 1
            print(f"STEP {os.getpid()} {bps.size()} {len(resets)} {state.step} "
                  f"{time.time():.3f}", flush=True)

    @bps.elastic.run
    def train(state):
        model.fit(x, y, batch_size=BATCHES, steps_per_epoch=steps_per_epoch, verbose=0,
                  epochs=1000 - state.epoch,
                  callbacks=[Stamp(), bps.elastic.CommitStateCallback(state, commit_every),
                             bps.elastic.UpdateBatchStateCallback(state),
                             bps.elastic.UpdateEpochStateCallback(state)])

    train(state)


class Job:
    """A running bpslaunch job whose output is read on a thread."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self.pids: dict[str, int] = {}  # host -> its first worker's pid
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))
            found = re.search(r"PID (\d+) (\S+)", line)
            if found:
                self.pids.setdefault(found.group(2), int(found.group(1)))

    def steps(self) -> list[tuple[int, int, int, int, float]]:
        return [tuple(map(float, m.groups())) for _, line in list(self.lines)
                for m in [STEP.search(line)] if m]

    def wait(self, condition, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while not condition():
            if time.time() > deadline or self.process.poll() is not None:
                tail = "\n".join(line for _, line in self.lines[-40:])
                raise RuntimeError(f"the job did not get there:\n{tail}")
            time.sleep(0.05)

    def server_pids(self) -> list[int]:
        return jobs.server_pids(self.process.pid)

    def end(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def step_time(steps, after: float, count: int = 15) -> float:
    """Median seconds per step of one worker over its first `count` steps after
    `after`."""
    steps = [x for x in steps if x[-1] > after]
    times = sorted(t for pid, *_, t in steps if pid == steps[0][0])[:count + 1]
    return statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


def fault(job: Job, name: str, act, size_after: int, results: list,
          reforms: bool = True) -> None:
    """Applies `act`, then measures the recovery of the job: its next re-forming, to
    `size_after` workers, or (`reforms` False: a lost server, which the job survives
    in its generation) its next steps."""
    before = job.steps()
    size_before, resets = int(before[-1][1]), max(r for _, _, r, _, _ in before)
    started = time.time()
    act()

    def recovered():
        return [(g, t) for _, size, r, g, t in job.steps()
                if t > started and (r > resets or not reforms)]

    job.wait(lambda: len(recovered()) >= 20 * size_after)
    step, first = min(recovered(), key=lambda x: x[1])
    assert all(int(size) == size_after for _, size, r, _, t in job.steps()
               if r > resets or (t > started and not reforms))
    # Read now: the lines printed before the fault may have reached us after it.
    last_step = max(g for *_, g, t in job.steps() if t <= started)
    after = [x for x in job.steps() if x[2] > resets or (x[-1] > started and not reforms)]
    results.append({
        "fault": name, "seconds_to_next_step": round(first - started, 2),
        "steps_lost": int(max(0, last_step - (step - 1))),
        "re-formed": max(r for _, _, r, _, _ in job.steps()) > resets,
        "step_s_before": round(step_time([x for x in before if x[2] == resets],
                                         started - 30), 3),
        "step_s_after": round(step_time(after, first), 3),
        "size": f"{size_before} -> {size_after}"})
    print(json.dumps(results[-1]), flush=True)


def restart_peer(workers: int, env: dict[str, str]) -> float:
    """Seconds from starting a fresh job of `workers` to its first completed step."""
    command = [sys.executable, "-m", "tf_bps.launch", "-np", str(workers), "--num-servers",
               "1", sys.executable, os.path.abspath(__file__), "--worker"]
    started = time.time()
    job = Job(command, env)
    try:
        job.wait(lambda: bool(job.steps()))
        return round(min(t for *_, t in job.steps()) - started, 2)
    finally:
        job.end()


def figures(results: list[dict], peer: float, hosts: int,
            batches_per_commit: int) -> list[report.Report]:
    """The table's figures, one Report per kind, and the peer beside the lost worker."""
    job = f"model.fit, {hosts} workers at first, 2 servers"
    recovery = report.Report(f"seconds from fault to next step, {job}", unit="s",
                             higher_is_better=False)
    lost = report.Report(f"steps lost (a commit every {batches_per_commit} batches), {job}",
                         unit="steps", higher_is_better=False)
    step_times = report.Report(f"median step time before and after the fault, {job}", unit="s",
                               higher_is_better=False)
    for r in results:
        recovery.add(r["fault"], "tf_bps elastic", r["seconds_to_next_step"])
        lost.add(r["fault"], "tf_bps elastic", r["steps_lost"])
        step_times.add(r["fault"], "before", r["step_s_before"])
        step_times.add(r["fault"], "after", r["step_s_after"])
    # The peer stands for the same loss: a job of one worker fewer, started again by hand.
    recovery.add("worker killed", f"restart by hand ({hosts - 1} workers)", peer)
    return [recovery, lost, step_times]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--batches-per-commit", type=int, default=5)
    report.add_arguments(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    env = {**os.environ, "BENCH_BATCHES_PER_COMMIT": str(args.batches_per_commit),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    with tempfile.TemporaryDirectory() as folder:
        hosts_file = os.path.join(folder, "hosts")
        names = [f"127.0.0.{i + 1}" for i in range(args.hosts + 1)]  # the last comes later
        with open(hosts_file, "w") as listing:
            listing.write("".join(f"{name}:1\n" for name in names[:-1]))
        command = [sys.executable, "-m", "tf_bps.launch", "--host-discovery-script",
                   f"cat {hosts_file}", "--min-np", "1", "--max-np", str(args.hosts + 1),
                   "--num-servers", "2",
                   sys.executable, os.path.abspath(__file__), "--worker"]
        job = Job(command, env)
        results: list[dict] = []
        try:
            start = args.hosts
            job.wait(lambda: len(job.steps()) >= 30 * start)
            fault(job, "worker killed", lambda: os.kill(job.pids[names[-2]], signal.SIGKILL),
                  start - 1, results)
            server = job.server_pids()[-1]
            fault(job, "server killed", lambda: os.kill(server, signal.SIGKILL), start - 1,
                  results, reforms=False)
            fault(job, "worker frozen (SIGSTOP)",
                  lambda: os.kill(job.pids[names[-3]], signal.SIGSTOP), start - 2, results)

            def add_host() -> None:
                with open(hosts_file, "a") as listing:
                    listing.write(f"{names[-1]}:1\n")

            fault(job, "host added", add_host, start - 1, results)
        finally:
            job.end()
            frozen = job.pids.get(names[-3])
            if frozen:
                try:
                    os.kill(frozen, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        peer = restart_peer(start - 1, env)
    print()
    print(f"model.fit, a 256-1024-1024-10 MLP, batch {BATCHES} per worker, a commit every "
          f"{args.batches_per_commit} batches, workers on this machine as separate hosts")
    print(f"{'fault':26} {'size':8} {'to next step (s)':>17} {'steps lost':>11} "
          f"{'re-formed':>10} {'step before (s)':>16} {'step after (s)':>15}")
    for r in results:
        print(f"{r['fault']:26} {r['size']:8} {r['seconds_to_next_step']:>17} "
              f"{r['steps_lost']:>11} {'yes' if r['re-formed'] else 'no':>10} "
              f"{r['step_s_before']:>16} {r['step_s_after']:>15}")
    print(f"peer: restarting a job of {start - 1} workers by hand, from bpslaunch to its first "
          f"step: {peer} s (before any checkpoint is read)")
    report.save(args, *figures(results, peer, args.hosts, args.batches_per_commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
