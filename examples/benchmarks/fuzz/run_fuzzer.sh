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
ops="$root/custom_ops"
# The reduction kernels use _Float16, which this clang lacks on x86, and the compressors
# vectorised templates (target_clones), which it cannot build: g++ builds those, clang
# the rest, instrumented.
g++ -std=c++17 -O2 -c "$ops/common/reduce.cc" -o "$work/reduce.o"
for source in "$ops"/compression/*.cc; do
  g++ -std=c++17 -O2 -c "$source" -o "$work/compression_$(basename "$source" .cc).o"
done
"$clang" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -pthread "$root/examples/benchmarks/fuzz/frame_fuzzer.cc" "$work/reduce.o" "$work"/compression_*.o \
  "$ops"/common/{common,logging}.cc \
  "$ops"/wire/{protocol,socket,shared_memory,transport,shared_memory_channel,auth,crypto}.cc \
  "$ops"/wire/waiting_room.cc "$ops"/rounds/*.cc \
  "$ops"/server/{server,acceptor,round_engine}.cc \
  -l:libcrypto.a \
  -o "$work/frame_fuzzer"
"$clang" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -pthread "$root/examples/benchmarks/fuzz/control_fuzzer.cc" "$ops"/common/{common,logging}.cc \
  "$ops"/control/{json,zmq_dealer}.cc "$ops"/wire/{socket,crypto}.cc -l:libcrypto.a \
  -o "$work/control_fuzzer"
for target in frame_fuzzer control_fuzzer; do
  mkdir -p "$work/corpus_$target"
  echo "== $target"
  # stderr of the target (its log lines) is closed; libFuzzer still reports crashes.
  "$work/$target" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=4096 \
    -close_fd_mask=2 "$work/corpus_$target" 2>&1 | tail -n 25
done
echo "corpora and binaries in $work"
