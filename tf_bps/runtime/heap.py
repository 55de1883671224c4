"""The C library's heap in a worker process: how much free memory it keeps.

glibc's malloc gives the free memory at the top of each of its heaps back to the system
once more than M_TOP_PAD (128 KB by default) is free there. A training step frees and
allocates its large tensors (activations, gradients, their updates) again every step,
so with that default every step can hand those pages back and fault them in again,
zeroed. Which process pays depends on where its tensors happen to lie: on 2 cores, a
ResNet-50 step under ParameterServerStrategy took 0.195 s with the default and 0.123 s
with a 32 MB pad, as much as plain Keras takes (examples/benchmarks/fit_pipeline_benchmark.py
measures it across hosts). The pad keeps at most that much more memory per heap.

No pad helps once M_TRIM_THRESHOLD is set, as TensorFlow's GeneratorDataset kernel does
for the whole process: malloc then no longer raises its mmap threshold (128 KB to begin
with), and larger tensors are mapped afresh each time. The strategy keeps that kernel
out of a worker with one CPU replica (strategies/parameter_server_strategy.py,
_input_options).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt's parameter number (malloc.h) and the pad a worker keeps.
M_TOP_PAD = -2
WORKER_TOP_PAD = 32 << 20


def keep_top_pad(pad: int = WORKER_TOP_PAD) -> bool:
    """Sets glibc's M_TOP_PAD to `pad` bytes for this process, unless the user chose one
    (MALLOC_TOP_PAD_, glibc's own variable) or the C library is not glibc. Whether it
    was set."""
    if "MALLOC_TOP_PAD_" in os.environ or not _is_glibc():
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return libc.mallopt(ctypes.c_int(M_TOP_PAD), ctypes.c_int(pad)) == 1


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):
        return False
