"""A worker keeps 32 MB free at the top of glibc's heap instead of 128 KB
(tf_bps/runtime/heap.py), unless MALLOC_TOP_PAD_ chose otherwise: 16 MB freed at the top
stays with the process (mallinfo2's keepcost) instead of going back to the system."""

import subprocess
import sys

import pytest
from harness import base_env

pytestmark = pytest.mark.unit

# Allocates 16 MB in 64 KB blocks (below the mmap threshold: they come from the heap),
# frees them from the top down, and prints whether init's call set the pad and how
# much free memory the heap kept at its top.
CHILD = """
import ctypes, ctypes.util, sys
from tf_bps.runtime import heap

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Mallinfo2
was_set = heap.keep_top_pad() if sys.argv[1] == "pad" else False
blocks = [libc.malloc(64 << 10) for _ in range(256)]
for block in reversed(blocks):
    libc.free(block)
print(was_set, libc.mallinfo2().keepcost)
"""


def _kept(mode: str, **env) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], env=base_env(**env),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    was_set, kept = done.stdout.split()
    return was_set, int(kept)


def test_the_pad_keeps_freed_memory_at_the_top_of_the_heap():
    was_set, kept = _kept("pad")
    assert was_set == "True" and kept >= 16 << 20, kept
    # Without it, glibc gives all but about its 128 KB default back.
    assert _kept("default")[1] < 1 << 20


def test_a_pad_the_user_chose_is_left_alone():
    was_set, kept = _kept("pad", MALLOC_TOP_PAD_=131072)
    assert was_set == "False" and kept < 1 << 20, kept
