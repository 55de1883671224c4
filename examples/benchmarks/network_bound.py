"""push_pull where the network is the bottleneck, against the floor the links allow and
against TensorFlow's ring all-reduce, on hosts made of network namespaces.

    sudo python examples/benchmarks/network_bound.py [--mbit 200] [--mb 4,64]
        [--layouts 2x2,4x2,4x4,2c,4c,4h2] [--encrypt] [--json PATH] [--plot PATH]

A layout "NxK" is N worker hosts (one worker each) and K separate server hosts; "Nc"
puts a server on each of the N worker hosts; "NhK" is the BytePS paper's hybrid, a
server on each of the N worker hosts plus K server-only hosts (tf_bps/runtime/server_shares.py
splits the traffic unevenly between them). Every host's link is limited to --mbit in
each direction (tests/netbed.py); the bandwidth B a host gets is measured with a plain
TCP transfer first. For each layout the script prints the median time of a push_pull
of each --mb size, the floor the links allow for that placement and the ratio:

    K separate server hosts, even split:   max(1, N/K) M/B
    servers on the N worker hosts:          2(N-1)M/(N B)   (also the ring optimum)
    hybrid, the paper's split:              2N(N-1)M/((N^2 + KN - 2K) B)

and MultiWorkerMirroredStrategy's ring all-reduce on the same N worker hosts. With
--encrypt, each layout runs again with BYTEPS_ENCRYPT=1, and its time and cost follow.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jobs
import report

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from netbed import NetBed  # noqa: E402  (the test bed lives with the tests)

WARMUP, STEPS = 2, 5
PORT = 29500
PROBE_SECONDS = 3


def timed_steps(run_once) -> float:
    samples = []
    for _ in range(WARMUP + STEPS):
        start = time.perf_counter()
        run_once()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples[WARMUP:])


def tf_bps_worker(out_path: str, nbytes: int) -> None:
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    tensor = tf.ones([nbytes // 4], tf.float32)
    seconds = timed_steps(lambda: bps.push_pull(tensor, name="gradient").numpy())
    if bps.rank() == 0:
        Path(out_path).write_text(json.dumps({"seconds": seconds}))
    bps.shutdown()


def mwms_worker(out_path: str, nbytes: int) -> None:
    import tensorflow as tf

    all_reduce = jobs.mwms_all_reduce()
    tensor = tf.ones([nbytes // 4], tf.float32)
    seconds = timed_steps(lambda: all_reduce(tensor).numpy())
    if jobs.is_mwms_chief():
        Path(out_path).write_text(json.dumps({"seconds": seconds}))


def receive(port: int) -> None:
    """The far end of the bandwidth probe: prints the rate at which bytes arrive once
    the flow is steady (after its first second, for PROBE_SECONDS), then closes."""
    with socket.create_server(("0.0.0.0", port)) as server:
        conn, _ = server.accept()
        with conn:
            conn.recv(1 << 20)
            steady = time.perf_counter() + 1
            while time.perf_counter() < steady:
                conn.recv(1 << 20)
            received, start = 0, time.perf_counter()
            while time.perf_counter() - start < PROBE_SECONDS:
                received += len(conn.recv(1 << 20))
            print(received / (time.perf_counter() - start), flush=True)


def measure_bandwidth(bed: NetBed) -> float:
    """Bytes per second one host receives from another through the limited links."""
    receiver = subprocess.Popen(bed.command(1, [sys.executable, __file__, "--receive"]),
                                stdout=subprocess.PIPE, text=True)
    try:
        probe = ("import socket, time\n"
                 f"for _ in range(100):\n"
                 f"    try: s = socket.create_connection(('{bed.address(1)}', {PORT})); break\n"
                 "    except OSError: time.sleep(0.1)\n"
                 "chunk = bytes(1 << 20)\n"
                 "try:\n"
                 "    while True: s.sendall(chunk)\n"
                 "except OSError: pass\n")
        subprocess.run(bed.command(0, [sys.executable, "-c", probe]), capture_output=True,
                       timeout=60)
        return float(receiver.communicate(timeout=30)[0].split()[-1])
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


@dataclasses.dataclass(frozen=True)
class Layout:
    workers: int  # worker hosts 0..N-1, one worker each
    server_only: int  # hosts N..N+K-1, one server each
    colocated: bool  # one server on each worker host too

    @classmethod
    def parse(cls, text: str) -> Layout:
        for mark, colocated in (("x", False), ("h", True)):
            if mark in text:
                n, k = text.split(mark)
                return cls(int(n), int(k), colocated)
        return cls(int(text.rstrip("c")), 0, True)

    @property
    def hosts(self) -> int:
        return self.workers + self.server_only

    @property
    def server_hosts(self) -> list[int]:
        return [*(range(self.workers) if self.colocated else ()),
                *range(self.workers, self.hosts)]

    def name(self) -> str:
        n, k = self.workers, self.server_only
        if not self.colocated:
            return f"{n} workers, {k} server hosts"
        return f"{n} workers, colocated" + (f" + {k} server hosts" if k else "")

    def floor(self, seconds_per_tensor: float) -> float:
        """The fewest seconds the links allow for a tensor taking `seconds_per_tensor` to
        cross one link."""
        n, k = self.workers, self.server_only
        if not self.colocated:
            return max(1.0, n / k) * seconds_per_tensor
        return 2 * n * (n - 1) / (n * n + k * n - 2 * k) * seconds_per_tensor


def run_layout(bed: NetBed, layout: Layout, nbytes: int, scratch: str,
               encrypt: bool = False) -> float:
    """Seconds per push_pull, the scheduler on the first server host."""
    workers, server_hosts = layout.workers, layout.server_hosts
    out_path = os.path.join(scratch, f"bps-{layout.name()}.json")
    env = {**os.environ, "DMLC_PS_ROOT_URI": bed.address(server_hosts[0]),
           "DMLC_PS_ROOT_PORT": str(PORT), "DMLC_NUM_WORKER": str(workers),
           "DMLC_NUM_SERVER": str(len(server_hosts)), "TF_CPP_MIN_LOG_LEVEL": "3",
           "BYTEPS_JOB_TOKEN": secrets.token_hex(16), "BYTEPS_ENCRYPT": str(int(encrypt))}
    launch = [sys.executable, "-m", "tf_bps.launch"]
    worker = [*launch, sys.executable, __file__, "--role", "tf_bps", "--out", out_path,
              "--mb", str(nbytes >> 20)]
    roles = [(server_hosts[0], launch, {"DMLC_ROLE": "scheduler"})]
    roles += [(host, launch, {"DMLC_ROLE": "server"}) for host in server_hosts]
    roles += [(host, worker, {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(host)})
              for host in range(workers)]
    jobs.run_processes([(bed.command(host, command), {**env, **extra})
                        for host, command, extra in roles])
    return json.loads(Path(out_path).read_text())["seconds"]


def run_ring(bed: NetBed, workers: int, nbytes: int, scratch: str) -> float:
    out_path = os.path.join(scratch, f"ring-{workers}.json")
    command = [sys.executable, __file__, "--role", "mwms", "--out", out_path,
               "--mb", str(nbytes >> 20)]
    return jobs.run_mwms(command, out_path, workers, bed=bed)["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbit", type=float, default=200, help="link rate per host and way")
    parser.add_argument("--mb", default="4,64", help="MB per push_pull, comma-separated")
    parser.add_argument("--layouts", default="2x2,4x2,4x4,2c,4c,4h2")
    parser.add_argument("--no-ring", action="store_true", help="skip the ring all-reduce")
    parser.add_argument("--encrypt", action="store_true",
                        help="run each layout again with BYTEPS_ENCRYPT=1")
    report.add_arguments(parser)
    parser.add_argument("--role", choices=["tf_bps", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--receive", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(mb) for mb in args.mb.split(",")]
    if args.receive:
        return receive(PORT)
    if args.role == "tf_bps":
        return tf_bps_worker(args.out, sizes[0] << 20)
    if args.role == "mwms":
        return mwms_worker(args.out, sizes[0] << 20)

    layouts = [Layout.parse(text) for text in args.layouts.split(",")]
    hosts = max(layout.hosts for layout in layouts)
    # One Report per size, as the tables are: a 4 MB push_pull's bars would vanish beside 64 MB's.
    figures: list[report.Report] = []
    with NetBed(hosts=hosts, mbit=args.mbit) as bed, tempfile.TemporaryDirectory() as scratch:
        bandwidth = measure_bandwidth(bed)
        print(f"links of {args.mbit:g} Mbit/s: B = {bandwidth / 1e6:.1f} MB/s measured; "
              f"median of {STEPS} steps")
        for size in sizes:
            print(f"\n{size} MB push_pull")
            times = report.Report(f"{size} MB push_pull, {args.mbit:g} Mbit/s links "
                                  f"(B = {bandwidth / 1e6:.1f} MB/s), median of {STEPS} steps",
                                  unit="s", higher_is_better=False)
            figures.append(times)
            sealed_header = f"  {'sealed s':>8}  {'cost':>6}" if args.encrypt else ""
            print(f"{'layout':>34}  {'tf_bps s':>8}  {'floor s':>7}  {'ratio':>5}  "
                  f"{'ring s':>6}  {'ring/tf_bps':>11}{sealed_header}")
            rings: dict[int, float] = {}
            for layout in layouts:
                nbytes = size << 20
                seconds = run_layout(bed, layout, nbytes, scratch)
                floor = layout.floor(nbytes / bandwidth)
                times.add(layout.name(), "tf_bps", seconds)
                times.add(layout.name(), "link floor", floor)
                ring = "      -            -"
                n = layout.workers
                if not args.no_ring:
                    if n not in rings:
                        rings[n] = run_ring(bed, n, nbytes, scratch)
                    ring = f"{rings[n]:6.2f}  {rings[n] / seconds:10.2f}x"
                    times.add(layout.name(), "ring all-reduce", rings[n])
                sealed = ""
                if args.encrypt:
                    sealed_seconds = run_layout(bed, layout, nbytes, scratch, encrypt=True)
                    sealed = f"  {sealed_seconds:8.2f}  {sealed_seconds / seconds - 1:6.1%}"
                    times.add(layout.name(), "sealed", sealed_seconds)
                print(f"{layout.name():>34}  {seconds:8.2f}  {floor:7.2f}  {seconds / floor:5.2f}  "
                      f"{ring}{sealed}", flush=True)
    report.save(args, *figures)


if __name__ == "__main__":
    main()
