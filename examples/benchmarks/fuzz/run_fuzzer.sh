#!/usr/bin/env bash
# Fuzzes every decoder of peer input with libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer: the data plane's (frame_fuzzer.cc), then the control
# plane's (control_fuzzer.cc), each for the seconds given. Needs clang (Debian:
# apt-get install clang-14).
#   examples/benchmarks/fuzz/run_fuzzer.sh [seconds]   (default 180)
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
seconds="${1:-180}"
clang="$(command -v clang++ || command -v clang++-14)"
work="$(mktemp -d)"
# The native server's sources less its main, as native_sources.bzl lists them for every
# build (its list assignments are also Python), so that a source that moves moves here
# too. The reduction kernels use _Float16, which this clang lacks on x86, and the
# compressors vectorised templates (target_clones), which it cannot build: g++ builds
# those, clang the rest, instrumented.
pieces="$(python3 -c '
import sys
lists = {}
exec(open(sys.argv[1]).read(), {"__builtins__": {}}, lists)
by_gcc = ["custom_ops/common/reduce.cc"] + lists["COMPRESSION_SOURCES"]
for source in lists["SERVER_SOURCES"]:
    if source != "custom_ops/server/main.cc":
        print("g++" if source in by_gcc else "clang", source)
' "$root/native_sources.bzl")"
flags=(-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -pthread)
# Each piece is compiled once; both targets link them all (the whole server links, so
# every reference resolves).
mkdir -p "$work/obj"
objects=()
while read -r compiler source; do
  object="$work/obj/${source//\//_}.o"
  if [[ "$compiler" == g++ ]]; then
    g++ -std=c++17 -O2 -c "$root/$source" -o "$object"
  else
    "$clang" "${flags[@]}" -c "$root/$source" -o "$object"
  fi
  objects+=("$object")
done <<< "$pieces"
for target in frame_fuzzer control_fuzzer; do
  "$clang" "${flags[@]}" "$root/examples/benchmarks/fuzz/$target.cc" "${objects[@]}" \
    -l:libcrypto.a -o "$work/$target"
done
for target in frame_fuzzer control_fuzzer; do
  mkdir -p "$work/corpus_$target"
  echo "== $target"
  # stderr of the target (its log lines) is closed; libFuzzer still reports crashes.
  "$work/$target" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=4096 \
    -close_fd_mask=2 "$work/corpus_$target" 2>&1 | tail -n 25
done
echo "corpora and binaries in $work"
