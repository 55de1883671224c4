#!/usr/bin/env bash
# The GPU path on any machine with an NVIDIA GPU, nvcc and CuPy; no TensorFlow and no
# network needed. Builds the core with CUDA into a virtualenv (.gpu-venv, which sees
# the machine's own packages: CuPy, numpy), then through real scheduler, server and
# worker processes driven with CuPy arrays through the core's C API:
#   - the CUDA kernels against numpy (tests/test_gpu_kernels.py);
#   - NCCL's collectives through the core's CUDA table (tests/test_gpu_group.py);
#   - every collective on device memory, each dtype against numpy, fp16, a BytePS
#     compressor, several tensors in flight, the caller's stream going on meanwhile,
#     the host's workers merging (with NCCL where each has a GPU of its own, else on
#     the host) (tests/test_device_staging.py, tests/workers/device_collectives.py);
#   - push_pull GB/s at 4, 64 and 256 MB from device memory next to the same from host
#     memory, the pinned-copy speed, and from the timeline of two GPU steps how much of
#     the device copies ran while partitions were on the network (tools/copy_overlap.py),
#     in one run.
# Ends with one summary line; a failure exits non-zero.
#
# What this machine lacks of pyzmq, pybind11, pytest and setuptools is installed from
# $TF_BPS_WHEELS (a folder of wheels) if set, else from the package index. For a machine
# without a network, fetch them elsewhere for its Python, say 3.12:
#   pip download --only-binary=:all: --python-version 3.12 -d wheels \
#     "pyzmq>=25" "pybind11>=2.12" pytest pytest-timeout setuptools wheel
# The core links OpenSSL's libcrypto statically: its headers and libcrypto.a
# (Debian's libssl-dev) must be here.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "gpu_check: FAILED: $*" >&2; exit 1; }
command -v nvcc >/dev/null || fail "no nvcc on PATH"
[ -f "$(g++ -print-file-name=libcrypto.a)" ] && echo '#include <openssl/evp.h>' |
  g++ -x c++ -fsyntax-only - 2>/dev/null ||
  fail "no OpenSSL headers and libcrypto.a for g++ (Debian: apt-get install libssl-dev)"
python3 -c "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0" 2>/dev/null ||
  fail "no GPU that CuPy can use"
started=$(date +%s)
python3 -m venv --system-site-packages .gpu-venv
py=.gpu-venv/bin/python
missing=$($py - <<'PY'
import importlib.util
wanted = {"zmq": "pyzmq>=25", "pybind11": "pybind11>=2.12", "pytest": "pytest",
          "pytest_timeout": "pytest-timeout", "setuptools": "setuptools>=68", "wheel": "wheel"}
print(" ".join(spec for module, spec in wanted.items() if importlib.util.find_spec(module) is None))
PY
)
if [ -n "$missing" ]; then
  where=()
  [ -n "${TF_BPS_WHEELS:-}" ] && where=(--no-index --find-links "$TF_BPS_WHEELS")
  # shellcheck disable=SC2086
  $py -m pip install -q --disable-pip-version-check "${where[@]}" $missing ||
    fail "cannot install $missing"
fi
# No TensorFlow here: the core, the server, the binding and the CUDA library are built.
$py -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e . ||
  fail "the build"
[ -n "$(ls tf_bps/_bps_gpu*.so 2>/dev/null)" ] || fail "nvcc did not build tf_bps/_bps_gpu"
log=$(mktemp -d)
$py -m pytest -q -rs -p no:cacheprovider tests/test_gpu_kernels.py tests/test_gpu_group.py \
  tests/test_device_staging.py > "$log/tests.txt" 2>&1 ||
  { tail -40 "$log/tests.txt"; fail "the GPU tests"; }
tests=$(tail -1 "$log/tests.txt")
echo "gpu_check: tests: $tests"
# Only what needs a second GPU, or NCCL where this machine has none, may skip.
grep "^SKIPPED.*no NCCL here" "$log/tests.txt" |
  sed 's/^/gpu_check: NCCL NOT TESTED: /'
skipped=$(grep "^SKIPPED" "$log/tests.txt" | grep -v "one GPU here\|no NCCL here")
[ -z "$skipped" ] || fail "GPU tests skipped on a GPU machine: $skipped"
bench() {  # memory (cuda|host), then VAR=value... -> the REPORT line of rank 0
  local memory=$1
  shift
  $py -m tf_bps.launch -np 2 --num-servers 2 env DEVICE_MEMORY="$memory" BENCH_MB=4,64,256 \
    BYTEPS_PARTITION_BYTES=4096000 PYTHONPATH=tests/workers "$@" $py \
    tests/workers/device_collectives.py > "$log/bench-$memory.txt" 2>&1 ||
    { tail -20 "$log/bench-$memory.txt"; fail "the $memory benchmark"; }
  grep -o '\[0\]: REPORT .*' "$log/bench-$memory.txt" | sed 's/^\[0\]: REPORT //'
}
# The GPU run records two timed steps of each size, for how much of its copies the
# network hid.
mkdir -p "$log/trace"
device=$(bench cuda BENCH_TRACE_DIR="$log/trace")
host=$(bench host)
hidden=$($py tools/copy_overlap.py "$log/trace" bench64)
hidden256=$($py tools/copy_overlap.py "$log/trace" bench256)
$py - "$device" "$host" "$hidden" "$hidden256" "$started" <<'PY'
import json, sys, time
device, host = json.loads(sys.argv[1]), json.loads(sys.argv[2])
overlaps = {"64": json.loads(sys.argv[3]), "256": json.loads(sys.argv[4])}
for report in (device, host):
    if report["failures"]:
        sys.exit(f"gpu_check: FAILED: {report['memory']}: {report['failures']}")
rows = []
for mb in ("4", "64", "256"):
    d, h = device["bench"][mb], host["bench"][mb]
    rows.append(f"{mb} MB {d} GB/s from GPU, {h} from host ({d / h:.2f}x)")
pinned = device["pinned_gb_s"]
print("gpu_check: push_pull " + "; ".join(rows))
print(f"gpu_check: pinned copies {pinned['to_host']} GB/s to host, "
      f"{pinned['to_device']} to the GPU")
for mb, overlap in overlaps.items():
    print(f"gpu_check: timeline of two {mb} MB steps: {overlap['copy_ms']} ms of device "
          f"copies, {overlap['hidden']:.0%} of it while partitions were on the network")
ratios = [device["bench"][mb] / host["bench"][mb] for mb in ("64", "256")]
hidden = min(overlap["hidden"] for overlap in overlaps.values())
print(f"gpu_check: OK in {time.time() - float(sys.argv[5]):.0f} s; 64/256 MB from GPU at "
      f"{min(ratios):.2f}x host (target 0.9x); device copies {hidden:.0%} hidden "
      f"(target 80%)")
PY
