"""The core's C API (custom_ops/worker/c_api.h) through ctypes, for worker scripts that
drive it without TensorFlow: with numpy arrays in host memory, with host memory
standing in for a device, or with CuPy arrays on a GPU. Loads the same _bps_core that
tf_bps's binding loaded, so bps.init() has set the worker up for it."""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from tf_bps.runtime.core import native_library

DTYPES = {"float16": 1, "float32": 3, "float64": 4, "int32": 5, "int64": 6, "uint8": 7,
          "int8": 8, "uint16": 9, "int16": 10}
KINDS = {"push_pull": 1, "broadcast": 2, "allgather": 3, "alltoall": 4, "reducescatter": 5,
         "async_push_pull": 6}
OPS = {"sum": 0, "average": 1, "min": 2, "max": 3, "product": 4}


class Op(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p), ("kind", ctypes.c_int), ("dtype", ctypes.c_int),
        ("reduce_op", ctypes.c_int), ("root_rank", ctypes.c_int), ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double), ("ndims", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_longlong)), ("input", ctypes.c_void_p),
        ("output", ctypes.c_void_p), ("bytes", ctypes.c_ulonglong),
        ("splits", ctypes.POINTER(ctypes.c_longlong)), ("nsplits", ctypes.c_int),
        ("process_set", ctypes.c_int), ("compression", ctypes.c_char_p),
        ("on_device", ctypes.c_int), ("device", ctypes.c_int), ("stream", ctypes.c_void_p),
    ]


ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_longlong), ctypes.c_int)
DONE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


def load() -> ctypes.CDLL:
    core = ctypes.CDLL(str(native_library("_bps_core")))
    core.bps_enqueue.argtypes = [ctypes.POINTER(Op), ALLOCATE, DONE, ctypes.c_void_p]
    core.bps_enqueue.restype = None
    core.bps_device_use.argtypes = [ctypes.c_char_p]
    core.bps_last_error.restype = ctypes.c_char_p
    return core


class Memory:
    """Where a script's tensors live: numpy arrays in host memory (device=None), numpy
    arrays behind the host stand-in (device 0), or CuPy arrays on GPU `device`."""

    def __init__(self, device: int | None = None, xp=np, stream=None):
        self.device, self.xp, self.stream = device, xp, stream

    def array(self, values: np.ndarray):
        return self.xp.asarray(values) if self.xp is not np else np.array(values)

    def empty(self, shape, dtype):
        return self.xp.empty(shape, dtype)

    def to_numpy(self, array) -> np.ndarray:
        return array.get() if self.xp is not np else array

    def pointer(self, array) -> int:
        return array.data.ptr if self.xp is not np else array.ctypes.data

    def stream_pointer(self) -> int | None:
        return self.stream.ptr if self.stream is not None else None


class Pending:
    """One enqueued operation: wait() returns its output (and an alltoall's received
    splits) or raises with the core's message."""

    def __init__(self, core, memory: Memory, op: Op, keep: list, output):
        self.memory, self.output, self.splits = memory, output, None
        self._event, self._error = threading.Event(), None
        self._keep = keep
        dtype = np.dtype(keep[0].dtype)

        def allocate(_ctx, index, shape, ndims):
            dims = tuple(shape[i] for i in range(ndims))
            if index == 1:  # an alltoall's splits: host memory
                self.splits = np.empty(dims, np.int64)
                return self.splits.ctypes.data
            self.output = memory.empty(dims, dtype)
            return memory.pointer(self.output) if self.output.size else memory.pointer(
                memory.empty((1,), dtype))

        def done(_ctx, kind, message):
            if kind:
                self._error = f"{kind}: {message.decode()}"
            self._event.set()

        self._callbacks = (ALLOCATE(allocate), DONE(done))
        core.bps_enqueue(ctypes.byref(op), *self._callbacks, None)

    def wait(self, timeout: float | None = 120):
        if not self._event.wait(timeout):
            raise TimeoutError("the core never finished the operation")
        if self._error:
            raise RuntimeError(self._error)
        if self.memory.stream is not None:
            self.memory.stream.synchronize()
        return self.output


def enqueue(core, memory: Memory, kind: str, name: str, tensor, *, reduce_op: str = "sum",
            root_rank: int = 0, prescale: float = 1.0, postscale: float = 1.0, splits=None,
            compression: str = "", in_place: bool = False) -> Pending:
    """Enqueues `kind` on `tensor` (an array of `memory`); the output is a new array where
    its size is known, else the core asks for it."""
    shape = (ctypes.c_longlong * max(1, tensor.ndim))(*tensor.shape)
    output = None
    if kind in ("push_pull", "broadcast", "async_push_pull"):
        output = tensor if in_place else memory.empty(tensor.shape, tensor.dtype)
    split_array = (ctypes.c_longlong * len(splits))(*splits) if splits is not None else None
    op = Op(name=name.encode(), kind=KINDS[kind], dtype=DTYPES[np.dtype(tensor.dtype).name],
            reduce_op=OPS[reduce_op], root_rank=root_rank, prescale=prescale,
            postscale=postscale, ndims=tensor.ndim, shape=shape,
            input=memory.pointer(tensor) if tensor.size else memory.pointer(
                memory.empty((1,), tensor.dtype)),
            output=memory.pointer(output) if output is not None else None,
            bytes=tensor.nbytes, splits=split_array, nsplits=len(splits) if splits else 0,
            process_set=0, compression=compression.encode(),
            on_device=int(memory.device is not None), device=memory.device or 0,
            stream=memory.stream_pointer())
    keep = [tensor, shape, split_array, output]
    return Pending(core, memory, op, keep, output)
