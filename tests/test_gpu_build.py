"""The GPU build. Where nvcc is found at build time (CUDA_HOME, or PATH), `pip install`
also compiles the core's CUDA kernels into tf_bps/_bps_gpu and GPU kernels of every
TensorFlow op. A machine without a GPU must still have them, load them, and get clear
errors from them, so that CI catches a broken GPU build."""

import ctypes
import json
import os
import shutil
import subprocess
import sys

import pytest
from gpu_api import declare, device_table
from harness import base_env

from tf_bps.runtime.core import NotBuiltError, native_library

FLOAT32, INT8, INT16, BOOL = 3, 8, 10, 11  # common.h DataType wire values

pytestmark = pytest.mark.build


def _nvcc_found() -> bool:
    """What setup.py looks for (its cuda_toolkit())."""
    home = os.environ.get("CUDA_HOME")
    return os.environ.get("TF_BPS_WITHOUT_CUDA") != "1" and bool(
        (home and os.path.exists(os.path.join(home, "bin", "nvcc"))) or shutil.which("nvcc"))


@pytest.fixture(scope="module")
def gpu_library():
    try:
        path = native_library("_bps_gpu")
    except NotBuiltError:
        if _nvcc_found():
            pytest.fail("nvcc is here but tf_bps/_bps_gpu was not built")
        pytest.skip("no CUDA toolkit at build time: a CPU-only build")
    library = declare(ctypes.CDLL(str(path)))
    return library


def test_the_gpu_library_loads_and_reports_its_devices(gpu_library):
    count = gpu_library.bps_gpu_device_count()
    if count >= 1:
        return  # A machine with a GPU: tests/test_gpu_kernels.py exercises it.
    assert count == -1
    assert gpu_library.bps_gpu_last_error().decode().startswith("cudaGetDeviceCount: ")


def test_bad_arguments_are_refused_before_any_launch(gpu_library):
    assert gpu_library.bps_gpu_reduce(None, None, 4, BOOL, 0, None) == -1
    assert "has no GPU arithmetic" in gpu_library.bps_gpu_last_error().decode()
    assert gpu_library.bps_gpu_reduce(None, None, 4, INT8, 9, None) == -1
    assert "reduce op 9" in gpu_library.bps_gpu_last_error().decode()
    assert gpu_library.bps_gpu_divide(None, 4, INT8, 0, None) == -1
    assert "not a worker count" in gpu_library.bps_gpu_last_error().decode()


def test_the_cuda_table_says_why_it_has_no_collectives(gpu_library):
    # Without NCCL, or without a GPU, the host's workers merge device tensors on the
    # host, and this reason is what the log gives (device_merge.h).
    api = device_table(gpu_library)
    key = ctypes.create_string_buffer(256)
    if api.device_key(0, key, len(key)) == 0:
        return  # A GPU and NCCL: tests/test_gpu_group.py exercises them.
    error = api.last_error().decode()
    assert error.startswith(("NCCL cannot be loaded (pip install tf_bps[gpu] brings it): ",
                             "cudaDeviceGetPCIBusId: ")), error
    assert api.group_has_dtype(FLOAT32) and not api.group_has_dtype(INT16)


OPS = ["BytepsPushPull", "BytepsBroadcast", "BytepsAsyncPushPull", "BytepsAllgather",
       "BytepsAlltoall", "BytepsReducescatter", "BytepsSetLearningRate"]


def test_every_op_has_gpu_kernels_exactly_when_cuda_was_found():
    probe = ("import json, tf_bps.runtime.ops\n"
             "from tensorflow.python.framework import kernels\n"
             f"print(json.dumps({{op: sorted({{(k.device_type, tuple(k.host_memory_arg)) for k in "
             f"kernels.get_registered_kernels_for_op(op).kernel}}) for op in {OPS!r}}}))")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert found.returncode == 0, found.stderr
    registered = json.loads(found.stdout.strip().splitlines()[-1])
    for op in OPS:
        devices = [device for device, _ in registered[op]]
        assert devices == (["CPU", "GPU"] if _nvcc_found() else ["CPU"]), (op, registered[op])
    if _nvcc_found():
        # Tensors stay on the device, handed to the core; only scalars and an alltoall's
        # splits are host memory.
        gpu = {op: list(dict(registered[op])["GPU"]) for op in OPS}
        for op in OPS[:6]:
            assert gpu[op] == (["splits", "received_splits"] if op == "BytepsAlltoall" else []), \
                (op, gpu[op])
        assert gpu["BytepsSetLearningRate"] == ["learning_rate"]


def test_workers_load_the_cuda_table_and_a_missing_gpu_is_a_clear_error(gpu_library):
    # One worker, no servers: bps.init() loads the CUDA library's device table, and a
    # push_pull of device memory then fails naming the device and CUDA's reason.
    probe = ("import numpy as np, tf_bps as bps\n"
             "from core_api import Memory, enqueue, load\n"
             "from tf_bps.runtime import core\n"
             "bps.init()\n"
             "print('table', core.worker_engine().device_table())\n"
             "fake = Memory(0)\n"  # host memory that claims to be on CUDA device 0
             "try:\n"
             "    enqueue(load(), fake, 'push_pull', 'g', np.ones(4, np.float32)).wait(30)\n"
             "except RuntimeError as error:\n"
             "    print('refused', error)\n")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=120, env=base_env())
    assert found.returncode == 0, found.stderr
    assert "table CUDA" in found.stdout, found.stdout
    if gpu_library.bps_gpu_device_count() < 1:
        assert "on CUDA device 0: cudaSetDevice: " in found.stdout, found.stdout
