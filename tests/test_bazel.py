"""The Bazel build (WORKSPACE, BUILD): it builds the native parts offline with Debian's
bazel-bootstrap, its C++ unit tests pass, and the libraries and server it builds run
a job in place of the pip-built ones. Skips where bazel is not installed (tools/bootstrap.sh
installs it with TF_BPS_BAZEL=1)."""

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_api import declare
from harness import WORKERS, marked_json

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.build,
              pytest.mark.skipif(shutil.which("bazel") is None, reason="bazel is not installed")]


# Bazel compiling from nothing beside two other test processes on 2 cores has taken
# 172-233 s, and 300 s once it started with the suite's heaviest files.
@pytest.mark.timeout(600)
def test_bazel_builds_tests_and_its_libraries_run_a_job(procs, tmp_path):
    built = subprocess.run(
        # --batch: no Bazel server is left running after the test.
        ["bazel", "--batch", "test", "//...", f"--repo_env=PYTHON_BIN_PATH={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "//:core_unit_test" in built.stdout + built.stderr
    # A copy of the package whose core and kernels are Bazel's. The pip-built worker
    # module links the core by its pip name: that name points at Bazel's file, so
    # the process maps one core, and both sides share its state.
    package = tmp_path / "tf_bps"
    shutil.copytree(ROOT / "tf_bps", package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "strategies", package / "strategies",
                    ignore=shutil.ignore_patterns("__pycache__"))
    bin_dir = ROOT / "bazel-bin"
    for stem in ("_bps_core", "_bps_tf_ops"):
        pip_built = next(package.glob(f"{stem}*.so"))
        pip_built.unlink()
        shutil.copy(bin_dir / f"{stem}.so", package / f"{stem}.so")
        if stem == "_bps_core":
            os.symlink(f"{stem}.so", pip_built)
    (package / "bps_server").unlink()  # The job's server is Bazel's too.
    shutil.copy(bin_dir / "bps_server", package / "bps_server")
    status, output = procs.launch(2, "bazel_built.py", num_servers=1,
                                  PYTHONPATH=f"{tmp_path}{os.pathsep}{WORKERS}")
    assert status == 0, output
    for report in marked_json(output).values():
        assert report["sum"] == 3.0
        assert report["kernels"] == str(package / "_bps_tf_ops.so")
        # With nvcc found, Bazel's op library has GPU kernels, as pip's does.
        has_nvcc = shutil.which("nvcc") is not None or bool(os.environ.get("CUDA_HOME"))
        assert report["push_pull_devices"] == (["CPU", "GPU"] if has_nvcc else ["CPU"])
        assert report["mapped"] == sorted([str(package / "_bps_core.so"),
                                           str(package / "_bps_tf_ops.so")]), report


def test_bazel_builds_the_gpu_kernels_where_nvcc_is_found():
    """@local_cuda finds nvcc as setup.py does; the kernels then build and load."""
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        pytest.skip("no nvcc: a CPU-only Bazel build has no GPU target")
    built = subprocess.run(
        ["bazel", "--batch", "build", "//:gpu_kernels",
         f"--repo_env=PYTHON_BIN_PATH={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    library = ROOT / "bazel-bin" / "_bps_gpu.so"
    assert library.exists()
    gpu = declare(ctypes.CDLL(str(library)))
    count = gpu.bps_gpu_device_count()
    assert count >= 1 or gpu.bps_gpu_last_error().decode().startswith("cudaGetDeviceCount: ")


def test_bazel_finds_nccl_under_byteps_nccl_home_and_links_it(tmp_path):
    """@local_cuda looks for NCCL where BytePS users keep it (BYTEPS_NCCL_HOME) and
    links the library it finds. No NCCL is installed here, so the test builds a
    stand-in for NVIDIA's library with the one call //:nccl_version makes."""
    home = tmp_path / "nccl"
    (home / "include").mkdir(parents=True)
    (home / "lib").mkdir()
    (home / "include" / "nccl.h").write_text(
        "typedef enum { ncclSuccess = 0 } ncclResult_t;\n"
        '#ifdef __cplusplus\nextern "C" {\n#endif\n'
        "ncclResult_t ncclGetVersion(int* version);\n"
        "#ifdef __cplusplus\n}\n#endif\n")
    source = tmp_path / "nccl.c"
    source.write_text('#include "nccl.h"\n'
                      "ncclResult_t ncclGetVersion(int* v) { *v = 21805; return ncclSuccess; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{home / 'include'}", str(source), "-o",
                    str(home / "lib" / "libnccl.so")], check=True, timeout=60)
    ran = subprocess.run(
        ["bazel", "--batch", "run", "//:nccl_version", f"--repo_env=BYTEPS_NCCL_HOME={home}",
         f"--repo_env=PYTHON_BIN_PATH={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip() == "NCCL 2.18.5", ran.stdout + ran.stderr
