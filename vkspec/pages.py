"""Letting go of memory whose bytes are elsewhere or no longer needed: a
mapped file's pages once the device holds them (drop), and the C heap's free
pages after a load that parsed a large file (trim_heap). And the opposite for
the CPU backend, whose weights are the file's pages: mapping them all in at
load (map_in, map_in_huge).

A weight uploaded to the device no longer needs its pages in this process:
dropping them (madvise DONTNEED) as each weight goes, instead of after the
last one, keeps the file from ever being resident in full next to the device
copy, which on an integrated GPU (and Lavapipe) is the same RAM. The pages
stay in the OS's page cache; a later read maps them again, so dropping is
never wrong, only a cost when the bytes are read again.

Only read-only views of a file mapping are dropped: DONTNEED on anonymous
memory would zero it.

map_in_huge: the same, with the file's pages in 2 MB folios of the page
cache, mapped 2 MB at a time.
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
        _populate(mm, [(0, len(mm))], "mapping weights")
    except OSError:                 # an older kernel: EINVAL
        return False
    return True


_STEP = 64 << 20


def _populate(mm: mmap.mmap, ranges, desc: str) -> None:
    """MADV_POPULATE_READ over ranges of mm, 64 MB a call, with a progress
    bar where a user waits: from a cold page cache a large file takes seconds."""
    from .progress import bar
    with bar(sum(hi - lo for lo, hi in ranges), desc, unit="B") as b:
        for lo, hi in ranges:
            for at in range(lo, hi, _STEP):
                mm.madvise(_POPULATE_READ, at, min(_STEP, hi - at))
                b.update(min(_STEP, hi - at))


_THP = "/sys/kernel/mm/transparent_hugepage/enabled"
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
_MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)
_HUGE = 2 << 20


def huge_pages_on() -> bool:
    """On Linux with transparent huge pages not turned off, unless
    VKSPEC_HUGE_PAGES=0 turns them off for vkspec."""
    if os.environ.get("VKSPEC_HUGE_PAGES") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        with open(_THP) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def ask_page_size(mm: mmap.mmap, size: int) -> bool:
    """Ask for 2 MB pages for a file mapping mm of `size` bytes, or, where
    huge pages are off, for 4 KB pages only (the page cache may hold the file
    in 2 MB folios from another process's read); whether 2 MB was asked."""
    if not sys.platform.startswith("linux") or size < _HUGE or not hasattr(mm, "madvise"):
        return False
    huge = huge_pages_on()
    try:
        mm.madvise(_MADV_HUGEPAGE if huge else _MADV_NOHUGEPAGE)
    except OSError:
        return False
    return huge


class _ScanArg(ctypes.Structure):      # struct pm_scan_arg, linux/fs.h
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "size", "flags", "start", "end", "walk_end", "vec", "vec_len", "max_pages",
        "category_inverted", "category_mask", "category_anyof_mask", "return_mask")]


class _Region(ctypes.Structure):      # struct page_region
    _fields_ = [(n, ctypes.c_uint64) for n in ("start", "end", "categories")]


_PAGEMAP_SCAN = 0xC0606610            # _IOWR('f', 16, struct pm_scan_arg)
_PAGE_IS_HUGE = 1 << 6


def huge_ranges(mm: mmap.mmap) -> list[tuple[int, int]]:
    """The [start, end) offsets of mapping mm this process maps 2 MB at a time
    (the pagemap's PAGEMAP_SCAN, Linux 6.7); none where the kernel cannot say."""
    import fcntl                        # POSIX only, as is the pagemap
    at = np.frombuffer(mm, np.uint8).ctypes.data
    end, out = at + len(mm), []
    regions = (_Region * 256)()
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return out
    try:
        start = at
        while start < end:
            arg = _ScanArg(size=ctypes.sizeof(_ScanArg), start=start, end=end, vec=ctypes.addressof(regions),
                           vec_len=len(regions), category_mask=_PAGE_IS_HUGE, return_mask=_PAGE_IS_HUGE)
            n = fcntl.ioctl(fd, _PAGEMAP_SCAN, arg)
            out += [(regions[i].start - at, regions[i].end - at) for i in range(n)]
            if n < len(regions) or arg.walk_end <= start:
                break
            start = arg.walk_end
    except OSError:                     # an older kernel: ENOTTY or EINVAL
        return []
    finally:
        os.close(fd)
    return out


def pmd_mapped(mm: mmap.mmap) -> int:
    """Bytes of mapping mm this process maps in 2 MB pages."""
    return sum(hi - lo for lo, hi in huge_ranges(mm))


def _holes(mm: mmap.mmap, whole: int) -> list[tuple[int, int]]:
    """The [start, end) ranges of 2 MB pages in mm's first `whole` bytes not
    mapped 2 MB at a time."""
    holes, at = [], 0
    for lo, hi in huge_ranges(mm) + [(whole, whole)]:
        lo, hi = min(lo, whole) // _HUGE * _HUGE, min(hi, whole)
        if lo > at:
            holes.append((at, lo))
        at = max(at, hi)
    return holes


def _evict(mm: mmap.mmap, path, holes) -> None:
    """Unmap the ranges `holes` of mm and evict the file's cached pages there,
    for a read that follows to bring them again. Only clean pages that no
    process maps are evicted (the kernel skips the others): the file and
    every other reader lose nothing."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for lo, hi in holes:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def map_in_huge(mm: mmap.mmap, path, size: int) -> int:
    """map_in, with the file's pages in 2 MB page-cache folios mapped 2 MB at
    a time; returns the bytes so mapped (0: map_in's pages, or none).

    Why: a decoding step streams every weight once, and from 4 KB pages each
    page is a TLB miss and the end of a hardware prefetch stream
    (docs/performance.md has what it costs). The page cache can hold a file in
    2 MB folios (ext4 since Linux 6.16, xfs), and a mapping 2 MB aligned (the
    kernel aligns a file's mapping that large) then maps each folio with one
    entry. The mapping asks for them (madvise HUGEPAGE), so the pages it reads
    from disk come in 2 MB folios. The parts of a file cached in small folios
    (a file just written or copied, or read back by another program after
    memory ran short) are evicted and read once more, after a 2 MB probe
    shows this file system gives 2 MB folios; a later load finds them cached,
    and maps 5 GB in milliseconds. Still the file's bytes, held once, shared
    with every process that maps the file. VKSPEC_HUGE_PAGES=0 keeps this
    mapping in 4 KB pages."""
    if not huge_pages_on() or size < 2 * _HUGE:     # read_gguf asked for the page size at open
        map_in(mm, size)
        return 0
    if not map_in(mm, size):        # too large to make resident: its faults bring 2 MB folios
        return 0
    holes = _holes(mm, size // _HUGE * _HUGE)
    if not holes:
        return pmd_mapped(mm)
    lo, hi = holes[0]
    try:
        _evict(mm, path, [(lo, lo + _HUGE)])          # a probe: one 2 MB folio
        mm.madvise(_POPULATE_READ, lo, _HUGE)
        if not any(a <= lo and lo + _HUGE <= b for a, b in huge_ranges(mm)):
            return pmd_mapped(mm)                   # the file system keeps small folios
        rest = [(a, b) for a, b in [(lo + _HUGE, hi)] + holes[1:] if b > a]
        _evict(mm, path, rest)
        _populate(mm, rest, "reading weights into 2 MB pages (once)")
    except OSError:                 # whatever was evicted faults back in when read
        pass
    return pmd_mapped(mm)
