"""The q8 block-dot kernel family (csrc/qdot.c): activation rows quantised
to int8 blocks and integer dot products against a weight in its file's
blocks. The same bits as exact.quantize_q8 / exact.q8_dot on every
instruction set (tests/test_q8.py).

Which library runs is chosen once, here: AVX-512 VNNI, AVX-VNNI, AVX2 or
plain C, the best the CPU has; ``VKSPEC_CPU_ISA`` (avx512, avxvnni, avx2,
plain) forces one.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ...cachedir import cache_root
from ...formats.intform import K_TYPES, block_size
from ...formats.matrix import QWeight
from .csrc import build
from .isa import _cpuinfo

FORMAT_IDS = {f: i for i, f in enumerate(
    ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "int8", "int4-g64", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"))}
_NEEDS = {"avx512": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
          "avxvnni": {"avx2", "fma", "f16c", "avx_vnni"}, "avx2": {"avx2", "fma", "f16c"}, "plain": set()}
_P, _I = ctypes.c_void_p, ctypes.c_int64


def variant() -> str:
    """The instruction set whose library runs (VKSPEC_CPU_ISA forces one)."""
    return _variant(os.environ.get("VKSPEC_CPU_ISA"))


@lru_cache(maxsize=None)
def _variant(forced: str | None) -> str:
    flags = _cpuinfo()[1]
    have = [v for v in build.VARIANTS if _NEEDS[v] <= flags]
    if forced:
        if forced not in build.VARIANTS:
            raise ValueError(f"VKSPEC_CPU_ISA={forced!r}: one of {', '.join(build.VARIANTS)}")
        if forced not in have:
            raise ValueError(f"VKSPEC_CPU_ISA={forced}: this CPU lacks {', '.join(sorted(_NEEDS[forced] - flags))}")
        return forced
    return have[0]


@lru_cache(maxsize=None)
def _lib(v: str):
    path = Path(build.HERE / "lib" / build.lib_name(v))
    if not path.exists():
        path = build.compile_one(v, cache_root() / "qdot")
    lib = ctypes.CDLL(str(path))
    lib.vk_q8_quantize.argtypes = [_P, _I, _I, _I, _P, _P, _P, _P]
    lib.vk_q8_quantize.restype = None
    lib.vk_q8_gemv.argtypes = [ctypes.c_int, _P, _I, _P, _I, _P, _I, _I, _P, _P, _P, _P, _I, _P, _I, ctypes.c_int]
    lib.vk_q8_gemv.restype = None
    return lib


def lib():
    return _lib(variant())


THREADS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


@dataclass
class Q8Rows:
    """Activation rows quantised for one block size: q int8 (n, C), d
    float32 (n, C // fb), sums of 16 columns (int16: |sum| <= 2032) and of
    32 columns (int32)."""
    fb: int
    q: np.ndarray
    d: np.ndarray
    s16: np.ndarray
    s32: np.ndarray

    @property
    def n(self) -> int:
        return self.q.shape[0]


def quantize(x: np.ndarray, fb: int) -> Q8Rows:
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, c = x.shape
    q = np.empty((n, c), np.int8)
    d = np.empty((n, c // fb), np.float32)
    s16 = np.empty((n, c // 16), np.int16)
    s32 = np.empty((n, c // 32), np.int32)
    lib().vk_q8_quantize(x.ctypes.data, n, c, fb, q.ctypes.data, d.ctypes.data, s16.ctypes.data, s32.ctypes.data)
    return Q8Rows(fb, q, d, s16, s32)


def gemv(w: QWeight, a: Q8Rows, out: np.ndarray | None = None) -> np.ndarray:
    """(n, w.rows) float32: every activation row of ``a`` against every
    logical row of w (``out`` may be a row-contiguous view, (n, >= rows))."""
    assert a.fb == block_size(w.fmt) and a.q.shape[1] == w.cols, (w.fmt, a.fb, a.q.shape, w.cols)
    n = a.n
    if out is None:
        out = np.empty((n, w.rows), np.float32)
    assert out.dtype == np.float32 and (out.strides[1] == 4 or n == 0)
    scales = w.scales if w.fmt in ("int8", "int4-g64") else None
    order = None if w.order is None else np.ascontiguousarray(w.order, np.int64)
    assert w.data.strides[1] == 1
    lib().vk_q8_gemv(FORMAT_IDS[w.fmt], w.data.ctypes.data, w.data.strides[0],
                     None if scales is None else scales.ctypes.data,
                     0 if scales is None else scales.strides[0] // 4,
                     None if order is None else order.ctypes.data, w.rows, w.cols,
                     a.q.ctypes.data, a.d.ctypes.data, a.s16.ctypes.data, a.s32.ctypes.data, n,
                     out.ctypes.data, out.strides[0] // 4, THREADS)
    return out


__all__ = ["K_TYPES", "Q8Rows", "quantize", "gemv", "variant", "lib"]
