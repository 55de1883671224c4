"""Every collective on tensors in device memory, through the core's C API without
TensorFlow; each result is checked against numpy here and the script prints a REPORT.

DEVICE_MEMORY picks the memory: "standin" (host memory standing in for a device, the
core's host table), "cuda" (CuPy arrays on this worker's GPU, through the core's CUDA
library: $BPS_GPU_LIBRARY, else tf_bps's own _bps_gpu) or "host" (plain host tensors,
the baseline). BENCH_MB: also times push_pull at those sizes (MB, comma separated),
recording two steps of each into BENCH_TRACE_DIR if set."""

import json
import os
import time
from contextlib import nullcontext

import numpy as np
from compression_model import both_legs, partitions
from core_api import DTYPES, Memory, enqueue, load

import tf_bps as bps
from tf_bps.runtime.core import native_library, preload_nccl

MEMORY = os.environ.get("DEVICE_MEMORY", "standin")
core = load()
if MEMORY == "cuda":
    import cupy

    preload_nccl()  # the wheel's NCCL, for the host's workers' merge
    library = os.environ.get("BPS_GPU_LIBRARY") or str(native_library("_bps_gpu"))
    assert core.bps_device_use(library.encode()) == 0, core.bps_last_error().decode()
elif MEMORY == "standin":
    assert core.bps_device_use(None) == 0, core.bps_last_error().decode()
bps.init()
rank, size = bps.rank(), bps.size()
if MEMORY == "cuda":
    device = bps.local_rank() % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(device).use()
    memory = Memory(device, cupy, cupy.cuda.Stream(non_blocking=True))
elif MEMORY == "standin":
    # STANDIN_DEVICES=per_worker: each worker of a host on a stand-in device of its own,
    # so that the local merge sums on the devices; else they share device 0.
    per_worker = os.environ.get("STANDIN_DEVICES") == "per_worker"
    memory = Memory(bps.local_rank() if per_worker else 0)
else:
    memory = Memory(None)
failures, checked = [], []


def values(seed: int, shape, dtype) -> np.ndarray:
    rng = np.random.default_rng(seed)
    low = 0 if np.dtype(dtype).kind == "u" else -4
    return rng.integers(low, 5, shape).astype(dtype)


def check(case: str, got, want) -> None:
    checked.append(case)
    got = memory.to_numpy(got)
    if got.shape != want.shape or not np.array_equal(got, want):
        failures.append(f"{case}: got {got.ravel()[:6]} (shape {got.shape}), "
                        f"want {want.ravel()[:6]} (shape {want.shape})")


def run(kind, name, local: np.ndarray, **options):
    with memory.stream or nullcontext():
        tensor = memory.array(local)
        return enqueue(core, memory, kind, name, tensor, **options)


# Sums of every dtype, and the other reductions: small tensors and ones of many partitions.
pending = {}
for dtype in DTYPES:
    for n in (7, 300_001):
        mine = values(rank * 1000 + n, (n,), dtype)
        pending[f"sum.{dtype}.{n}"] = (run("push_pull", f"sum.{dtype}.{n}", mine), sum(
            values(r * 1000 + n, (n,), dtype) for r in range(size)).astype(dtype))
for op, combine in (("min", np.minimum), ("max", np.maximum), ("product", np.multiply)):
    everyone = [values(r + 50, (4, 1000), "int32") for r in range(size)]
    want = everyone[0]
    for other in everyone[1:]:
        want = combine(want, other)
    pending[op] = (run("push_pull", op, everyone[rank], reduce_op=op), want)
# An average with both scale factors, in place, of float32 and float16.
for dtype in ("float32", "float16"):
    everyone = [values(r + 70, (200_000,), dtype) for r in range(size)]
    want = (np.sum([e.astype(np.float64) * 0.5 for e in everyone], axis=0) / size * 3)
    pending[f"average.{dtype}"] = (
        run("push_pull", f"average.{dtype}", everyone[rank], reduce_op="average",
            prescale=0.5, postscale=3.0, in_place=True), want.astype(dtype))
for case, (op, want) in pending.items():
    check(case, op.wait(), want)

# Broadcast from the last rank, allgather of uneven rows, alltoall with splits,
# reducescatter of rows that do not divide evenly.
root = size - 1
check("broadcast", run("broadcast", "broadcast", values(rank + 90, (250_000,), "float64"),
                       root_rank=root).wait(), values(root + 90, (250_000,), "float64"))
rows = [values(r + 110, (r + 1, 3), "float32") for r in range(size)]
check("allgather", run("allgather", "allgather", rows[rank]).wait(), np.concatenate(rows))


def block(sender: int, receiver: int) -> np.ndarray:
    return np.full((receiver + 1, 2), 100 * sender + receiver, np.int64)


sent = run("alltoall", "alltoall", np.concatenate([block(rank, j) for j in range(size)]),
           splits=[j + 1 for j in range(size)])
check("alltoall", sent.wait(), np.concatenate([block(s, rank) for s in range(size)]))
check("alltoall.splits", sent.splits, np.full(size, rank + 1, np.int64))
tensors = [values(r + 130, (2 * size + 1, 4), "int32") for r in range(size)]
total = np.sum(tensors, axis=0).astype(np.int32)
first = rank * ((2 * size + 1) // size) + min(rank, (2 * size + 1) % size)
mine = (2 * size + 1) // size + (1 if rank < (2 * size + 1) % size else 0)
check("reducescatter", run("reducescatter", "reducescatter", tensors[rank]).wait(),
      total[first:first + mine])

# A BytePS compressor works on the staged partitions: what every worker receives is the
# model of both compressed legs.
SPEC = bps.Compression.topk(0.05, ef="vanilla").spec
n = 100_000
senders = [values(r + 150, (n,), "float32") for r in range(size)]
got = run("push_pull", "topk", senders[rank], reduce_op="average", compression=SPEC).wait()
if size == 1:  # no servers: nothing is compressed
    want = senders[0]
else:
    # With BYTEPS_LOCAL_MERGE=1 each host's workers sum first: the host's sum is pushed.
    local = bps.local_size() if os.environ.get("BYTEPS_LOCAL_MERGE") == "1" else 1
    hosts = [sum(senders[h:h + local]) for h in range(0, size, local)]  # who pushes
    parts = partitions(n, int(os.environ["BYTEPS_PARTITION_BYTES"]),
                       int(os.environ["DMLC_NUM_SERVER"]))
    want = both_legs(SPEC, "topk", [hosts], parts, size)[0]
checked.append("topk")
worst = float(np.max(np.abs(memory.to_numpy(got) - want)))
if worst > 1e-5:
    failures.append(f"topk: {worst} from the model of both legs")

# Many tensors in flight at once, several steps: each step's sums are that step's.
for step in range(3):
    flights = [(run("push_pull", f"flight{i}", values(rank + 10 * step + i, (65_536,), "float32")),
                np.sum([values(r + 10 * step + i, (65_536,), "float32") for r in range(size)],
                       axis=0)) for i in range(8)]
    for i, (op, want) in enumerate(flights):
        check(f"flight{i}.step{step}", op.wait(), want)

# The caller's stream goes on while a push_pull is in flight: work queued on it after
# the enqueue finishes before the push_pull does (the stream waits only at the end).
if MEMORY == "cuda":
    with memory.stream:
        tensor = memory.array(np.ones(64 << 18, np.float32))
        op = enqueue(core, memory, "push_pull", "overlap", tensor, in_place=True)
        side = cupy.ones(1 << 20, np.float32)
        for _ in range(20):
            side = side * 1.0001
        ran = cupy.cuda.Event()
        ran.record()
    ran.synchronize()
    checked.append("stream")
    if op._event.is_set():
        failures.append("stream: the caller's stream waited for the push_pull")
    op.wait()

report = {"rank": rank, "memory": MEMORY, "checked": len(checked), "failures": failures}
if MEMORY == "cuda":  # pinned host copies, each way, 256 MB
    import cupyx

    host, device_buffer = cupyx.empty_pinned(64 << 20, np.float32), cupy.empty(64 << 20, np.float32)
    speeds = {}
    for way, copy in (("to_host", lambda: device_buffer.get(out=host)),
                      ("to_device", lambda: device_buffer.set(host))):
        copy()
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(5):
            copy()
        cupy.cuda.Device().synchronize()
        speeds[way] = round(5 * host.nbytes / (time.perf_counter() - start) / 1e9, 1)
    report["pinned_gb_s"] = speeds
if os.environ.get("BENCH_MB"):
    report["bench"] = {}
    # BENCH_TRACE_DIR: each size's second and third timed steps are recorded there
    # (tools/copy_overlap.py reads how much of the device copies the network hid).
    trace_dir = os.environ.get("BENCH_TRACE_DIR")
    for mb in [int(x) for x in os.environ["BENCH_MB"].split(",")]:
        with memory.stream or nullcontext():
            tensor = memory.array(np.ones(mb * 1024 * 256, np.float32))
        enqueue(core, memory, "push_pull", f"bench{mb}", tensor, in_place=True).wait()  # warm
        start, rounds = time.perf_counter(), 5
        for round_ in range(rounds):
            if trace_dir and round_ in (1, 3):  # two steps recorded, then three untraced
                (bps.start_timeline(f"{trace_dir}/bench{mb}.{rank}.json") if round_ == 1
                 else bps.stop_timeline())
            enqueue(core, memory, "push_pull", f"bench{mb}", tensor, in_place=True).wait()
        seconds = (time.perf_counter() - start) / rounds
        report["bench"][mb] = round(mb / 1024 / seconds, 3)  # GB/s of the tensor
bps.shutdown()
print("REPORT " + json.dumps(report), flush=True)
