"""Memory over a long job, and at the peak of one large push_pull.

    python examples/benchmarks/soak_benchmark.py [--steps 10000] [--peak-gib 1]
        [--json PATH] [--plot PATH]

1. Runs tests/workers/soak.py (every call pattern, checked value by value) for
   --steps steps with 2 workers and 2 servers on this machine, and prints each
   worker's and server's memory at steps 1, 1,000 and the last: private (RssAnon),
   mapped shared (RssShmem) and owned shared (the arenas it made), in MB
   (tests/workers/memory.py says what each counts).
2. Runs one push_pull of --peak-gib GiB of float32 with 2 workers and 1 server, sampling
   every process's memory every few milliseconds, and prints each one's peak above
   its level before the input existed, as a multiple of the tensor (the bounds: a
   worker 3x, for input, output and one staging copy; a server 1.5x): private + owned
   shared, what it takes from the machine, and private + mapped shared (its resident
   size, where a page a peer made and this one reads counts again). Then the same with
   the workers merging first (BYTEPS_LOCAL_MERGE=1; by default they do not, with the
   server on their host), and the peer in the same run, the job over TCP loopback
   (BYTEPS_ENABLE_IPC=0), whose peaks are all private memory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import report

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "workers"))
from memory import descendants, process_memory, servers_of, watch_soak  # noqa: E402

MB = 1 << 20
LAUNCH = [sys.executable, "-m", "tf_bps.launch"]


def job_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "workers"),
                                           env.get("PYTHONPATH", "")]))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def soak(steps: int) -> list[report.Report]:
    marks = sorted({1, min(1000, steps), steps})
    command = [*LAUNCH, "-np", "2", sys.executable, str(ROOT / "tests/workers/soak.py")]
    job = subprocess.Popen(command, env=job_env(TEST_STEPS=steps, TEST_REPORT_EVERY=1000),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    workers, servers, output = watch_soak(job, marks, time.monotonic() + 4 * 3600)
    job.wait(timeout=60)
    if job.returncode != 0 or any("WRONG" in line for line in output):
        sys.exit("the soak failed:\n" + "".join(output[-50:]))
    print(f"soak.py, {steps} steps, 2 workers + 2 servers on one host; MB "
          "private / mapped shared / owned shared:")
    rows = [(f"worker {rank}", {step: workers.get((rank, step)) for step in marks})
            for rank in (0, 1)]
    rows += [(f"server {index}", {step: servers.get((index, step)) for step in marks})
             for index in (0, 1)]
    print(f"{'':10}" + "".join(f"{'step ' + str(step):>24}" for step in marks))
    for name, by_step in rows:
        cells = ["-" if not m else f"{m['anon'] / MB:.0f} / {m['shared'] / MB:.0f} / "
                 f"{m['owned'] / MB:.0f}" for m in by_step.values()]
        print(f"{name:10}" + "".join(f"{cell:>24}" for cell in cells))
    # One Report per kind of memory in a cell: they count different pages.
    kinds = {"anon": "private memory (RssAnon)", "shared": "mapped shared memory (RssShmem)",
             "owned": "owned shared memory (arenas it made)"}
    figures = {key: report.Report(f"soak.py {what}, {steps} steps, 2 workers + 2 servers",
                                  unit="MB", higher_is_better=False)
               for key, what in kinds.items()}
    for name, by_step in rows:
        for step, m in by_step.items():
            if not m:  # printed as "-": not sampled at that step
                continue
            for key, figure in figures.items():
                figure.add(name, f"step {step}", m[key] / MB)
    return list(figures.values())


def peak_worker(gib: float) -> None:
    """One push_pull of `gib` GiB; prints when the input is about to exist, exists,
    and the result is in (time.monotonic(), shared with the sampler)."""
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    elements = int(gib * (1 << 30)) // 4
    bps.push_pull(tf.ones([16]), name="warm")
    print(f"PHASE before {time.monotonic()}", flush=True)
    data = tf.ones([elements])
    print(f"PHASE start {time.monotonic()}", flush=True)
    result = bps.push_pull(data, average=False, name="big")
    print(f"PHASE end {time.monotonic()}", flush=True)
    assert float(result[-1]) == bps.size(), float(result[-1])
    bps.shutdown()


def sample(launcher: subprocess.Popen, samples: list, stop: threading.Event) -> None:
    """(time, pid, what, private + owned, private + mapped shared) of every worker and
    server, every ~2 ms."""
    while not stop.is_set():
        now = time.monotonic()
        servers = set(servers_of(launcher.pid))
        for pid in descendants(launcher.pid):
            try:
                with open(f"/proc/{pid}/cmdline") as cmdline:
                    is_worker = "--peak-worker" in cmdline.read()
                if pid not in servers and not is_worker:
                    continue
                memory = process_memory(pid)
            except OSError:
                continue
            samples.append((now, pid, "server" if pid in servers else "worker",
                            memory["anon"] + memory["owned"], memory["anon"] + memory["shared"]))
        time.sleep(0.002)


def peak(gib: float, env: dict) -> dict[str, tuple[float, float]]:
    command = [*LAUNCH, "-np", "2", "--num-servers", "1", sys.executable, __file__,
               "--peak-worker", str(gib)]
    job = subprocess.Popen(command, env=job_env(**env),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    samples: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(job, samples, stop))
    sampler.start()
    output, _ = job.communicate(timeout=900)
    stop.set()
    sampler.join()
    if job.returncode != 0:
        sys.exit("the push_pull job failed:\n" + output[-5000:])
    phases = {}
    for line in output.splitlines():
        if "PHASE " in line:
            name, at = line.split("PHASE ", 1)[1].split()
            phases.setdefault(name, []).append(float(at))
    before, end = min(phases["before"]), max(phases["end"])
    ratios = {}
    for pid in sorted({sample[1] for sample in samples}):
        mine = [(t, what, owned, mapped) for t, p, what, owned, mapped in samples if p == pid]
        base = [m for m in mine if m[0] <= before]
        during = [m for m in mine if before < m[0] <= end + 0.05]
        if not base or not during:
            continue
        what = mine[-1][1]  # a server starts as the launcher's Python, then is bps_server
        key = f"{what} {len([k for k in ratios if k.startswith(what)])}"
        ratios[key] = tuple((max(m[i] for m in during) - base[-1][i]) / (gib * (1 << 30))
                            for i in (2, 3))
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--peak-gib", type=float, default=1.0)
    parser.add_argument("--peak-worker", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--skip-soak", action="store_true")
    report.add_arguments(parser)
    args = parser.parse_args()
    if args.peak_worker:
        peak_worker(args.peak_worker)
        return
    soak_figures = [] if args.skip_soak else soak(args.steps)
    print(f"\npeak memory of one {args.peak_gib:g} GiB push_pull above the level before, "
          "x the tensor: private + owned shared (private + mapped shared):")
    peaks = {what: report.Report(f"peak rise of {what}, one {args.peak_gib:g} GiB push_pull, "
                                 "2 workers + 1 server", unit="x the tensor",
                                 higher_is_better=False)
             for what in ("private + owned shared", "private + mapped shared")}
    for label, env in (("shared memory", {}),
                       ("the same, merged first", {"BYTEPS_LOCAL_MERGE": 1}),
                       ("TCP (BYTEPS_ENABLE_IPC=0)", {"BYTEPS_ENABLE_IPC": 0})):
        ratios = peak(args.peak_gib, env)
        print(f"  {label:28}" + ", ".join(f"{k} {owned:.2f}x ({mapped:.2f}x)"
                                          for k, (owned, mapped) in sorted(ratios.items())))
        for k, (owned, mapped) in sorted(ratios.items()):
            peaks["private + owned shared"].add(k, label, owned)
            peaks["private + mapped shared"].add(k, label, mapped)
    report.save(args, *soak_figures, *peaks.values())


if __name__ == "__main__":
    main()
