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
memory would zero it (hold_in_huge_pages' copies are never dropped).

hold_in_huge_pages (VKSPEC_HUGE_PAGES=1): the CPU backend's weights read
from 2 MB pages. The file's pages are 4 KB, and a decoding step streams every
weight once: a TLB miss and a prefetch stream that stops at each 4 KB page
(docs/performance.md has what it costs). The file's bytes are read into
anonymous memory asked for in huge pages (madvise HUGEPAGE: the kernel's
transparent huge pages, where its setting is not "never"), which then takes
the file mapping's place at the same address, so every view made of the file
reads the copy: the same bytes, still one copy, in the file's layout.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

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
    if held(lo):
        return False
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


_HELD: list = []                    # (start, end) of every mapping hold_in_huge_pages replaced
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"
_MADV_HUGEPAGE, _MREMAP_MAYMOVE, _MREMAP_FIXED = 14, 1, 2
_HUGE, _CHUNK = 2 << 20, 64 << 20


def held(address: int) -> bool:
    """Whether address lies in a mapping hold_in_huge_pages replaced (anonymous: never dropped)."""
    return any(lo <= address < hi for lo, hi in _HELD)


def huge_pages_on() -> bool:
    """Asked for (VKSPEC_HUGE_PAGES=1), on Linux with transparent huge pages
    not turned off. Not the default: where free memory is scattered or not yet
    backed (a VM's), the kernel reclaims and compacts to find 2 MB pages, and a
    load waits for it (docs/performance.md)."""
    if os.environ.get("VKSPEC_HUGE_PAGES") != "1" or not sys.platform.startswith("linux"):
        return False
    try:
        with open(_THP) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def _c():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    libc.mprotect.argtypes = libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def hold_in_huge_pages(mm: mmap.mmap, path, size: int) -> bool:
    """Put a copy of the file at `path` (`size` bytes) in huge pages where
    its read-only mapping mm is (see the module's docstring); False, and the
    file mapping left as it was, where it cannot be done (no huge pages, the
    file over half the machine's memory, which must stay evictable, or any
    call failing). The copy is read from the file in 64 MB steps, so the file's
    own pages are never mapped: peak RSS stays one copy. When mm is closed,
    its munmap frees the copy."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return False
    if not huge_pages_on() or size > ram // 2 or size < _HUGE:
        return False
    libc = _c()
    at = np.frombuffer(mm, np.uint8).ctypes.data
    length = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
    raw = libc.mmap(None, length + _HUGE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if raw is None or raw == ctypes.c_void_p(-1).value:
        return False
    start = (raw + _HUGE - 1) // _HUGE * _HUGE          # 2 MB aligned: whole huge pages
    if start > raw:
        libc.munmap(raw, start - raw)
    if raw + _HUGE > start:
        libc.munmap(start + length, raw + _HUGE - start)
    done = 0
    try:
        libc.madvise(start, length, _MADV_HUGEPAGE)
        view = memoryview((ctypes.c_char * length).from_address(start)).cast("B")
        with open(path, "rb", buffering=0) as f:
            while done < size:
                got = f.readinto(view[done:min(size, done + _CHUNK)])
                if not got:
                    break
                done += got
        view.release()
    except OSError:
        done = -1
    if done != size or libc.mprotect(start, length, mmap.PROT_READ) != 0 or \
            libc.mremap(start, length, length, _MREMAP_MAYMOVE | _MREMAP_FIXED, at) != at:
        libc.munmap(start, length)
        return False
    _HELD.append((at, at + length))
    return True
