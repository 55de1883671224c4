#!/usr/bin/env bash
# Sets up a development environment from nothing: a virtualenv in .venv with
# TensorFlow and the test tools, and tf_bps installed in it (building the C++ ops).
# Safe to run again: it only installs what is missing and rebuilds the ops.
set -euo pipefail
cd "$(dirname "$0")/.."
# OpenSSL's libcrypto (libssl-dev) is linked into the core and the server; the
# multi-host tests run a real sshd in network namespaces and a real mpirun (they skip
# without them); with TF_BPS_BAZEL=1, Debian's Bazel for the Bazel build (BUILD) and
# its test. Installed only where we are root and apt-get exists.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  packages="libssl-dev openssh-server openmpi-bin default-jre-headless"
  if [ "${TF_BPS_BAZEL:-0}" = 1 ]; then packages="$packages bazel-bootstrap"; fi
  install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    $packages >/dev/null; }
  install || { apt-get update -q >/dev/null && install; } ||
    echo "bootstrap: could not install $packages; the tests that need them will skip" >&2
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check \
  "tensorflow==2.21.0" "ml_dtypes<0.7" tensorboard "pyzmq>=25" numpy "setuptools>=68" wheel \
  "pybind11>=2.12" pytest pytest-timeout pytest-xdist ruff build kubernetes pyspark "ray[train]" \
  prometheus-client
# ml_dtypes below 0.7 (TensorFlow asks for >=0.5.1): 0.7.0's extension takes 0.55 s of CPU
# to load, against 0.02 s for 0.6.0, and TensorFlow loads it in every process.
# Not matplotlib (the benchmarks' --plot asks for it): Keras imports it whenever it is
# installed, 0.35 s of CPU in every TensorFlow process the suite starts.
# The examples' real data, offline afterwards: scikit-learn's digits, taken from its
# wheel rather than installed (Keras imports scikit-learn whenever it is installed, which
# costs every TensorFlow process 0.7 s). examples/digits_data.py reads the file.
if [ ! -s examples/data/digits.csv.gz ]; then
  wheels=$(mktemp -d)
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps \
    --only-binary=:all: scikit-learn -d "$wheels"
  mkdir -p examples/data
  .venv/bin/python - "$wheels"/scikit_learn-*.whl > examples/data/digits.csv.gz <<'EOF'
import sys, zipfile
sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read("sklearn/datasets/data/digits.csv.gz"))
EOF
  rm -rf "$wheels"
fi
# --no-build-isolation: the ops must be compiled against the TensorFlow just installed.
# With nvcc found (CUDA_HOME or PATH) the core's CUDA kernels are built too.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation -e .
