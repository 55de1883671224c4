"""ctypes signatures of the core's GPU C API (custom_ops/worker/cuda/gpu_api.h), for the
tests that load it; imports neither TensorFlow nor tf_bps."""

import ctypes


def declare(library: ctypes.CDLL) -> ctypes.CDLL:
    pointer, size, number = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    library.bps_gpu_last_error.restype = ctypes.c_char_p
    library.bps_gpu_reduce.argtypes = [pointer, pointer, size, number, number, pointer]
    library.bps_gpu_divide.argtypes = [pointer, size, number, number, pointer]
    library.bps_gpu_scale.argtypes = [pointer, size, number, ctypes.c_double, pointer]
    for name in ("bps_gpu_compress_fp16", "bps_gpu_decompress_fp16"):
        getattr(library, name).argtypes = [pointer, pointer, size, pointer]
    return library
