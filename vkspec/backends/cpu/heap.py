"""The C heap's policy for a forward's scratch (glibc's malloc, which NumPy,
numba and the qdot library all allocate from).

Why: a prefill block's temporaries (its activation rows, a few MB each at
real widths, and the q8 tiles) are freed at the end of every call. glibc
gives the top of its heap back to the kernel once more than its trim
threshold is free there, and the next call faults the same memory in again,
zeroed; NumPy asks for huge pages on arrays of 4 MB and more, so each fault
zeroes 2 MB. A 186-token prefill at Qwen3-1.7B widths took about 350,000
page faults a run, 7% of its time in the kernel's page clearing
(docs/performance.md).

What: the two thresholds fixed where glibc's own dynamic rule would take
them on its own (an mmap threshold of 32 MB, its ceiling, and a trim
threshold of twice that), from the first call instead of after the first
large free. Blocks under 32 MB come from the heap and at most 64 MB stays
free at its top between calls: memory the forward had already touched.
Other allocators (musl) have no mallopt; nothing is done there.

A KV cache is another matter: sized for the whole context, it is touched a
row at a time, and only its touched pages should count. From the heap it
could reuse freed memory, which calloc clears, touching all of it (the
1.7B-width file at a 4096-token context: peak RSS 1.26 -> 2.04 GB).
:func:`lazy_zeros` gives such arrays pages of their own, which the kernel
hands out zeroed as they are first written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap

import numpy as np

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3           # malloc.h
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
_done: list = []


def keep_scratch() -> bool:
    """Set the thresholds once a process; whether glibc took them."""
    if not _done:
        ok = False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = getattr(libc, "mallopt", None)
            if mallopt is not None:
                mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
                ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        except OSError:
            ok = False
        _done.append(ok)
    return _done[0]


def lazy_zeros(shape, dtype=np.float32) -> np.ndarray:
    """A zeroed array in an anonymous mapping of its own: its pages are
    resident only once written, whatever the malloc policy (the array holds
    the mapping; it goes with the array)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if n == 0:
        return np.zeros(shape, dt)
    return np.frombuffer(mmap.mmap(-1, n), dtype=dt).reshape(shape)
