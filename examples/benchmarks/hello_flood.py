"""Training while strangers flood the scheduler with hellos, against the same job's
steps before the flood.

    python examples/benchmarks/hello_flood.py [--peers 2000] [--seconds 12] [--same-priority]
        [--json PATH] [--plot PATH]

Starts a job role by role on this machine (the scheduler, one server, 2 workers that
push_pull 4 MB for as long as the run lasts, a job token), and a flooding process: once
the workers have trained for a while, --peers ZeroMQ DEALER connections to the
scheduler's port each say a well-formed hello, over and over, for --seconds, reading
the challenges back as a stranger would. Prints the median step time before the flood
and during it, their ratio, how many hellos the flood sent and how many the scheduler
answered, and the scheduler's resident memory before and at the end of the flood. Every
node must stay in the job: the scheduler keeps no state for a hello, reads strangers at
a bounded rate (tf_bps/control/throttle.py) and still hears the heartbeats.

The flood stands for strangers on other machines, so it runs at the lowest priority
(nice 19): on a small machine it would otherwise take a whole core from the job, which
measures the machine rather than the scheduler. --same-priority measures that too.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import jobs
import report

WARM_UP_S = 20.0  # from the start: TensorFlow imports, registration, first steps
CALM_S = 8.0  # steps timed before the flood
TAIL_S = 3.0  # steps after the flood, so that no worker ends while it lasts


def worker(out_path: str, until: float) -> None:
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    tensor = tf.ones([1 << 20], tf.float32)
    steps = []
    while True:
        start = time.time()
        bps.push_pull(tensor, name="flooded").numpy()
        steps.append((start, time.time() - start))
        # The workers stop together (one more step than the other would wait for its
        # peer forever): every 20 steps, outside the timing, they vote on the clock.
        if len(steps) % 20 == 0:
            late = tf.constant([float(time.time() >= until)])
            if bps.push_pull(late, name="time_is_up", average=False).numpy()[0] > 0:
                break
    if bps.rank() == 0:
        with open(out_path, "w") as out:
            json.dump(steps, out)
    bps.shutdown()


def flood(port: int, peers: int, start: float, end: float, out_path: str,
          same_priority: bool) -> None:
    import zmq

    if not same_priority:
        os.nice(19)
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, peers + 16)  # ZeroMQ's default is 1023
    dealers = []
    for _ in range(peers):
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDHWM, 100)
        dealers.append(dealer)
    time.sleep(max(0.0, start - time.time()))
    for dealer in dealers:
        dealer.connect(f"tcp://127.0.0.1:{port}")
    hello = json.dumps({"type": "hello", "nonce": "0" * 32}).encode()
    sent = answered = 0
    while time.time() < end:
        for dealer in dealers:
            try:
                dealer.send(hello, zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                pass
            while dealer.poll(0):
                dealer.recv()
                answered += 1
    for dealer in dealers:
        dealer.close()
    context.term()
    with open(out_path, "w") as out:
        json.dump({"sent": sent, "answered": answered}, out)


def resident_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sample_memory(pid: int, when: dict[str, float], out: dict[str, float]) -> None:
    """The resident memory of process `pid` at each of the wall-clock times `when`."""
    for label, at in sorted(when.items(), key=lambda item: item[1]):
        time.sleep(max(0.0, at - time.time()))
        out[label] = resident_mb(pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=12.0, help="how long the flood lasts")
    parser.add_argument("--same-priority", action="store_true",
                        help="run the flood at the job's priority (by default it runs niced)")
    report.add_arguments(parser)
    parser.add_argument("--role", choices=["worker", "flood"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--end", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.role == "worker":
        return worker(args.out, args.end)
    if args.role == "flood":
        return flood(args.port, args.peers, args.start, args.end, args.out, args.same_priority)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    flood_start = time.time() + WARM_UP_S + CALM_S
    flood_end = flood_start + args.seconds
    with tempfile.TemporaryDirectory() as scratch:
        steps_path, flood_path = (os.path.join(scratch, name) for name in ("steps", "flood"))
        env = {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
               "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1",
               "BYTEPS_JOB_TOKEN": "the flooded job's token"}
        launch = [sys.executable, "-m", "tf_bps.launch"]
        worker_command = [*launch, sys.executable, __file__, "--role", "worker", "--out",
                          steps_path, "--end", str(flood_end + TAIL_S)]
        flood_command = [sys.executable, __file__, "--role", "flood", "--port", str(port),
                         "--peers", str(args.peers), "--start", str(flood_start), "--end",
                         str(flood_end), "--out", flood_path,
                         *(["--same-priority"] if args.same_priority else [])]
        scheduler = subprocess.Popen([sys.executable, "-m", "tf_bps.control.scheduler"],
                                     env={**env, "DMLC_ROLE": "scheduler"})
        try:
            others = [(launch, {**env, "DMLC_ROLE": "server"}),
                      (worker_command, {**env, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": "0"}),
                      (worker_command, {**env, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": "1"}),
                      (flood_command, env)]
            memory = {}
            sampler = threading.Thread(target=sample_memory, daemon=True, args=(
                scheduler.pid, {"before": flood_start - 1, "end": flood_end - 0.5}, memory))
            sampler.start()
            jobs.run_processes(others)
            sampler.join()
            if scheduler.wait(timeout=60) != 0:
                raise RuntimeError("the scheduler failed")
        finally:
            if scheduler.poll() is None:
                scheduler.kill()
                scheduler.wait()
        steps = json.load(open(steps_path))
        flooded = json.load(open(flood_path))
    calm = [took for start, took in steps if flood_start - CALM_S <= start < flood_start]
    # From a second in: the peers connecting are part of the flood, but the first
    # second is mostly their TCP handshakes.
    during_flood = [took for start, took in steps if flood_start + 1 <= start < flood_end]
    if not calm or not during_flood:
        raise RuntimeError(f"too few steps: {len(calm)} before the flood, "
                           f"{len(during_flood)} in it (the job started later than "
                           f"{WARM_UP_S:g} s?)")
    before, during = statistics.median(calm), statistics.median(during_flood)
    print(f"2 workers, 1 server, 4 MB push_pull; {args.peers} strangers flooding the scheduler "
          f"with hellos for {args.seconds:g} s ({flooded['sent']} hellos sent, "
          f"{flooded['answered']} answered)")
    print(f"median step before the flood {before * 1e3:.1f} ms ({len(calm)} steps), during it "
          f"{during * 1e3:.1f} ms ({len(during_flood)} steps): {during / before:.2f}x")
    print(f"scheduler resident memory: {memory['before']:.0f} MB before the flood, "
          f"{memory['end']:.0f} MB at its end")
    # The priority is part of the case: a flood at the job's priority measures the machine too.
    case = f"{args.peers} strangers, " + ("same priority" if args.same_priority else "niced")
    step_times = report.Report("4 MB push_pull median step, 2 workers, 1 server; "
                               f"{args.seconds:g} s of hellos ({flooded['sent']} sent, "
                               f"{flooded['answered']} answered)", unit="ms",
                               higher_is_better=False)
    step_times.add(case, "before the flood", before * 1e3)
    step_times.add(case, "during the flood", during * 1e3)
    scheduler_memory = report.Report("scheduler resident memory, 2 workers, 1 server, "
                                     f"{args.seconds:g} s of hellos", unit="MB",
                                     higher_is_better=False)
    scheduler_memory.add(case, "before the flood", memory["before"])
    scheduler_memory.add(case, "at its end", memory["end"])
    report.save(args, step_times, scheduler_memory)


if __name__ == "__main__":
    main()
