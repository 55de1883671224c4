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


_F = ctypes.CFUNCTYPE
_P, _I, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t


class DeviceApi(ctypes.Structure):
    """custom_ops/worker/device_api.h's bps_device_api, field for field."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("last_error", _F(ctypes.c_char_p)),
        ("stream_create", _F(_I, _I, ctypes.POINTER(_P))),
        ("stream_destroy", _F(None, _I, _P)),
        ("stream_wait", _F(_I, _I, _P, _P)),
        ("copy", _F(_I, _I, _P, _P, _S, _P)),
        ("scale", _F(_I, _I, _P, _S, _I, ctypes.c_double, _P)),
        ("divide", _F(_I, _I, _P, _S, _I, _I, _P)),
        ("call_when_done", _F(_I, _I, _P, _P, _P)),
        ("host_alloc", _F(_I, _I, _S, ctypes.POINTER(_P))),
        ("host_free", _F(None, _I, _P)),
        ("device_key", _F(_I, _I, ctypes.c_char_p, _S)),
        ("group_id", _F(_I, _P)),
        ("group_open", _F(_I, _I, _P, _I, _I, ctypes.POINTER(_P))),
        ("group_close", _F(None, _I, _P, _I)),
        ("group_has_dtype", _F(_I, _I)),
        ("group_reduce", _F(_I, _I, _P, _P, _S, _I, _I, _I, _P, _P)),
        ("group_broadcast", _F(_I, _I, _P, _S, _I, _I, _P, _P)),
        ("group_check", _F(_I, _I, _P)),
        ("group_begin", _F(_I)),
        ("group_end", _F(_I)),
    ]


GROUP_ID_BYTES = 128  # BPS_GROUP_ID_BYTES


def device_table(library: ctypes.CDLL) -> DeviceApi:
    """The CUDA device table of the core's CUDA library (bps_gpu_device_api)."""
    library.bps_gpu_device_api.restype = ctypes.POINTER(DeviceApi)
    return library.bps_gpu_device_api().contents
