"""Letting go of memory whose bytes are elsewhere or no longer needed: a
mapped file's pages once the device holds them (drop), and the C heap's free
pages after a load that parsed a large file (trim_heap). And the opposite for
the CPU backend, whose weights are the file's pages: mapping them all in at
load (map_in).

A weight uploaded to the device no longer needs its pages in this process:
dropping them (madvise DONTNEED) as each weight goes, instead of after the
last one, keeps the file from ever being resident in full next to the device
copy, which on an integrated GPU (and Lavapipe) is the same RAM. The pages
stay in the OS's page cache; a later read maps them again, so dropping is
never wrong, only a cost when the bytes are read again.

Only read-only views of a file mapping are dropped: DONTNEED on anonymous
memory would zero it.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np
from numpy.lib.array_utils import byte_bounds

_libc = None


def _file_mapped(a: np.ndarray) -> bool:
    if a.flags.writeable:
        return False
    base = a
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False


def drop(a: np.ndarray) -> bool:
    """Drop the pages under view `a` of a read-only file mapping; False (and
    nothing done) for any other array."""
    global _libc
    if a.size == 0 or not hasattr(mmap, "MADV_DONTNEED") or not _file_mapped(a):
        return False
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    lo, hi = byte_bounds(a)
    start = lo // mmap.PAGESIZE * mmap.PAGESIZE
    return _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(hi - start), mmap.MADV_DONTNEED) == 0


def trim_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc malloc_trim).

    Why: building a tokenizer from its JSON (Gemma 3: 262k tokens, 515k
    merges) peaks at ~360 MB in the Rust library, and glibc keeps ~200 MB of
    that freed heap resident; the model loaded next would stack on top of it.
    Elsewhere than glibc this does nothing."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    trim = getattr(_libc, "malloc_trim", None)
    return bool(trim(0)) if trim is not None else False


_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)     # Linux 5.14


def map_in(mm: mmap.mmap, size: int) -> bool:
    """Map every page of a read-only file mapping into the process now (from
    the page cache, or read from disk), when the file takes at most half the
    machine's memory; False (nothing done) otherwise, or where the OS cannot.

    Why: the CPU backend's weights are views into the file, and a prompt reads
    nearly all of them (a MoE's experts included). Left to fault in a page at
    a time, they were mapped inside the first timed forward, on its threads;
    here the cost moves to loading, where llama.cpp's warm-up pays it too.
    The pages are the file's (the page cache's), not the process's heap."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return False
    if size > ram // 2 or not hasattr(mm, "madvise"):
        return False
    try:
        mm.madvise(_POPULATE_READ)
    except OSError:                 # an older kernel: EINVAL
        return False
    return True
