"""The GPU build. Where nvcc is found at build time (CUDA_HOME, or PATH), `pip install`
also compiles the core's CUDA kernels into tf_bps/_bps_gpu. A machine without a GPU
must still have the library, load it, and get clear errors from it, so that CI catches
a broken GPU build."""

import ctypes
import os
import shutil

import pytest
from gpu_api import declare

from tf_bps.core import NotBuiltError, native_library

INT8, BOOL = 8, 11  # common.h DataType wire values


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
