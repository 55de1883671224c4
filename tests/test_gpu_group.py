"""The CUDA device table's collectives (NCCL, custom_ops/worker/cuda/gpu_group.cu) on
real GPUs, through the table itself with CuPy arrays (no TensorFlow): NCCL found by
name once tf_bps loaded the wheel's copy, a group of one per GPU, a reduce to a root
and a broadcast from it; with two GPUs or more, two members on threads of their own.
Skips where there is no GPU, CuPy or CUDA build of the core (CI has none)."""

import ctypes
import threading

import numpy as np
import pytest
from gpu_api import GROUP_ID_BYTES, device_table

from tf_bps.runtime.core import gpu_library, preload_nccl

cupy = pytest.importorskip("cupy")
FLOAT32, SUM = 3, 0  # common.h wire values


@pytest.fixture(scope="module")
def table():
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no GPU")
    library = gpu_library()
    if library is None:
        pytest.skip("tf_bps was built without CUDA (tools/gpu_check.sh builds it)")
    preload_nccl()
    api = device_table(ctypes.CDLL(str(library)))
    key = ctypes.create_string_buffer(256)
    if api.device_key(0, key, len(key)) != 0:
        error = api.last_error().decode()
        assert "NCCL" in error, error  # the one reason a GPU has no groups
        pytest.skip(f"no NCCL here: {error}")
    return api


def _check(api, result):
    assert result == 0, api.last_error().decode()


def _member(api, group_id, size, member, results):
    cupy.cuda.Device(member).use()
    stream = cupy.cuda.Stream(non_blocking=True)
    group = ctypes.c_void_p()
    _check(api, api.group_open(member, group_id, size, member, ctypes.byref(group)))
    values = cupy.full(300_001, member + 1, cupy.float32)
    total = cupy.zeros_like(values)
    shared = cupy.full(1000, 7 if member == 0 else 0, cupy.float32)
    _check(api, api.group_begin())
    _check(api, api.group_reduce(member, values.data.ptr, total.data.ptr, values.size, FLOAT32,
                                 SUM, 0, group, stream.ptr))
    _check(api, api.group_end())
    _check(api, api.group_broadcast(member, shared.data.ptr, shared.size, FLOAT32, 0, group,
                                    stream.ptr))
    stream.synchronize()
    _check(api, api.group_check(member, group))
    api.group_close(member, group, 0)
    results[member] = (cupy.asnumpy(total), cupy.asnumpy(shared))


def _run_group(api, size):
    group_id = ctypes.create_string_buffer(GROUP_ID_BYTES)
    _check(api, api.group_id(group_id))
    results = [None] * size
    threads = [threading.Thread(target=_member, args=(api, group_id, size, m, results))
               for m in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(r is not None for r in results), "a member failed (see its exception above)"
    return results


def test_a_group_of_one_reduces_and_broadcasts(table):
    key = ctypes.create_string_buffer(256)
    _check(table, table.device_key(0, key, len(key)))
    assert key.value, "no PCI bus id for GPU 0"
    assert table.group_has_dtype(FLOAT32) and not table.group_has_dtype(10)  # int16
    (total, shared), = _run_group(table, 1)
    assert np.all(total == 1) and np.all(shared == 7)


def test_two_gpus_sum_onto_the_root(table):
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU here: NCCL refuses two members on one GPU")
    results = _run_group(table, 2)
    assert np.all(results[0][0] == 3)  # 1 + 2 at the root
    assert np.all(results[1][1] == 7)  # the root's values everywhere
