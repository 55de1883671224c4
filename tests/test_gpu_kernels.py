"""The core's CUDA kernels on a real GPU, through their C API with CuPy arrays (no
TensorFlow): every dtype's sums, min, max, products and averages against numpy, scale
factors, and fp16 compression. Compiles custom_ops/worker/cuda with the nvcc found here;
skips where there is no GPU, CuPy or nvcc (CI has none)."""

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gpu_api import declare

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.build  # compiles the kernels with nvcc
ROOT = Path(__file__).resolve().parent.parent
# common.h wire values
DTYPES = {"float16": 1, "float32": 3, "float64": 4, "int32": 5, "int64": 6, "uint8": 7,
          "int8": 8, "uint16": 9, "int16": 10}
OPS = {"sum": 0, "average": 1, "min": 2, "max": 3, "product": 4}


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no GPU")
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if not nvcc:
        pytest.skip("no nvcc to build the kernels with")
    library = tmp_path_factory.mktemp("gpu") / "libbps_gpu.so"
    build = subprocess.run(
        [nvcc, "-std=c++17", "-O3", "-shared", "-Xcompiler=-fPIC", "-arch=native",
         str(ROOT / "custom_ops" / "common" / "common.cc"),
         str(ROOT / "custom_ops" / "worker" / "cuda" / "gpu_kernels.cu"), "-o", str(library)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    lib = declare(ctypes.CDLL(str(library)))
    return lib


def _check(lib, result):
    assert result == 0, lib.bps_gpu_last_error().decode()
    cupy.cuda.Device().synchronize()


def _values(dtype, seed, count=100_003):  # odd: the grid-stride tail is exercised
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.integers(-8, 8, count).astype(dtype)
    low = 0 if np.dtype(dtype).kind == "u" else -5
    return rng.integers(low, 6, count).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_reductions_match_numpy(gpu, dtype, op):
    a, b = _values(dtype, 1), _values(dtype, 2)
    dst, src = cupy.asarray(a), cupy.asarray(b)
    _check(gpu, gpu.bps_gpu_reduce(dst.data.ptr, src.data.ptr, a.size, DTYPES[dtype], OPS[op],
                                   None))
    combine = {"sum": np.add, "average": np.add, "min": np.minimum, "max": np.maximum,
               "product": np.multiply}[op]
    np.testing.assert_array_equal(cupy.asnumpy(dst), combine(a, b).astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_averages_and_scale_factors_match_numpy(gpu, dtype):
    a = _values(dtype, 3) * 3
    buf = cupy.asarray(a)
    _check(gpu, gpu.bps_gpu_divide(buf.data.ptr, a.size, DTYPES[dtype], 4, None))
    if np.dtype(dtype).kind == "f":
        want = (a.astype(np.float64) * (1 / 4)).astype(dtype)
    else:
        want = np.floor_divide(a, 4)
    np.testing.assert_array_equal(cupy.asnumpy(buf), want)
    buf = cupy.asarray(a)
    _check(gpu, gpu.bps_gpu_scale(buf.data.ptr, a.size, DTYPES[dtype], 0.5, None))
    scaled = a.astype(np.float64) * 0.5  # integers truncate toward zero, as a cast does
    want = scaled if np.dtype(dtype).kind == "f" else np.trunc(scaled)
    np.testing.assert_array_equal(cupy.asnumpy(buf), want.astype(dtype))


def test_fp16_compression_round_trip(gpu):
    values = np.random.default_rng(4).normal(size=1 << 20).astype(np.float32)
    src = cupy.asarray(values)
    half = cupy.empty(values.size, cupy.float16)
    back = cupy.empty(values.size, cupy.float32)
    _check(gpu, gpu.bps_gpu_compress_fp16(src.data.ptr, half.data.ptr, values.size, None))
    np.testing.assert_array_equal(cupy.asnumpy(half), values.astype(np.float16))
    _check(gpu, gpu.bps_gpu_decompress_fp16(half.data.ptr, back.data.ptr, values.size, None))
    np.testing.assert_array_equal(cupy.asnumpy(back), values.astype(np.float16).astype(np.float32))
