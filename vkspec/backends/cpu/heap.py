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

:func:`kv_cache` also lays each KV head's rows out one after another (the
array seen as (rows, nkv, hd) is a view of (nkv, rows, hd)). Row-major
(rows, nkv, hd) puts a head's successive keys nkv * hd * 4 bytes apart: a
new 4 KB page per key at 8 heads of 128 columns, and hardware prefetchers
stop at a page's end, so attention waited on every key. A decode step reads
each head's keys and values in order; head by head it streams them
(docs/performance.md). Only the memory order changes, never a value.
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


def kv_cache(rows: int, nkv: int, hd: int) -> np.ndarray:
    """A zeroed KV cache seen as (rows, nkv, hd), laid out head by head
    (``heads_first`` gives the (nkv, rows, hd) array the compiled kernels
    read); from lazy_zeros, so only written rows are resident."""
    return lazy_zeros((nkv, rows, hd)).transpose(1, 0, 2)


def kv_copy(rows: np.ndarray) -> np.ndarray:
    """A copy of a cache's rows (rows, nkv, hd) in kv_cache's layout (a
    snapshot that later runs as a state is written in place like the live one)."""
    return np.ascontiguousarray(rows.transpose(1, 0, 2), dtype=np.float32).transpose(1, 0, 2)


def heads_first(cache: np.ndarray, writable: bool = False) -> np.ndarray:
    """The (nkv, rows, hd) C-contiguous float32 array of a (rows, nkv, hd)
    cache: kv_cache's own memory without a copy; any other array copied
    (never where the caller writes into it: that would write the copy)."""
    hm = cache.transpose(1, 0, 2)
    if hm.dtype == np.float32 and hm.flags.c_contiguous:
        return hm
    if writable:
        raise ValueError("a KV cache the compiled attention writes must come from heap.kv_cache")
    return np.ascontiguousarray(hm, dtype=np.float32)
