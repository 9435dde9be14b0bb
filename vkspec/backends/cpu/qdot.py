"""The q8 block-dot kernel family (csrc/qdot.c): activation rows quantised
to int8 blocks and integer dot products against a weight in its file's
blocks. The same bits as exact.quantize_q8 / exact.q8_dot on every
instruction set (tests/test_q8.py).

Which library runs is chosen once, here: AVX-512 VNNI, AVX-VNNI, AVX2 or
plain C, the best the CPU has. ``VKSPEC_CPU_ISA`` (avx512, avx2, plain: the
numba kernels' names) caps it: avx2 means no VNNI and no AVX-512.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ...cachedir import cache_root
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
    if not forced:
        return have[0]
    # the numba kernels' names (jit_ir): avx512 allows any VNNI, avx2 none, plain no vectors
    allowed = {"avx512": ("avx512", "avxvnni", "avx2", "plain"), "avx2": ("avx2", "plain"), "plain": ("plain",)}
    if forced not in allowed:
        raise ValueError(f"VKSPEC_CPU_ISA={forced!r}: one of {', '.join(allowed)}")
    return next(v for v in allowed[forced] if v in have)


@lru_cache(maxsize=None)
def _lib(v: str):
    path = Path(build.HERE / "lib" / build.lib_name(v))
    if not path.exists():
        path = build.compile_one(v, cache_root() / "qdot")
    return open_library(path)


def open_library(path):
    """The kernel library at path, its entry points typed (tests/bench/qdot_ab.py
    opens another commit's build this way)."""
    lib = ctypes.CDLL(str(path))
    lib.vk_q8_quantize.argtypes = [_P, _I, _I, _I, _P, _P, _P, _P]
    lib.vk_q8_quantize.restype = None
    lib.vk_q8_gemvs.argtypes = [_P, ctypes.c_int, _P, _I, ctypes.c_int]
    lib.vk_q8_gemvs.restype = ctypes.c_int
    lib.vk_q8_gemvs_each.argtypes = [_P, ctypes.c_int, _P, _P, ctypes.c_int]
    lib.vk_q8_gemvs_each.restype = ctypes.c_int
    lib.vk_scores.argtypes = [_P, _I, _P, _I, _I, _P, _I, _I, _I, ctypes.c_float]
    lib.vk_scores.restype = None
    lib.vk_float_rows.argtypes = [ctypes.c_int, _P, _I, _I, _P, _I, _I, _P, _I]
    lib.vk_float_rows.restype = None
    return lib


def lib():
    return _lib(variant())


THREADS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


@dataclass
class Q8Rows:
    """What vk_q8_quantize makes of activation rows (the tests read it; a
    GEMV quantises inside its own call): q int8 (n, C), d
    float32 (n, C // fb), sums of 16 columns (int16: |sum| <= 2032) and of
    32 columns (int32), views of one buffer; ``ptrs``: their addresses."""
    fb: int
    q: np.ndarray
    d: np.ndarray
    s16: np.ndarray
    s32: np.ndarray
    ptrs: tuple = ()


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data          # slow (an object a call): taken once a buffer, never per argument


def quantize(x: np.ndarray, fb: int) -> Q8Rows:
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, c = x.shape
    sizes = (n * c, 4 * n * (c // fb), 2 * n * (c // 16), 4 * n * (c // 32))
    at = [0]
    for b in sizes:                                   # each part 64-byte aligned
        at.append(at[-1] + -(-b // 64) * 64)
    buf = np.empty(at[-1] + 64, np.uint8)
    base = _addr(buf)
    skew = -base % 64
    q, d, s16, s32 = (buf[skew + at[k]: skew + at[k] + sizes[k]] for k in range(4))
    a = Q8Rows(fb, q.view(np.int8).reshape(n, c), d.view(np.float32).reshape(n, c // fb),
               s16.view(np.int16).reshape(n, c // 16), s32.view(np.int32).reshape(n, c // 32),
               tuple(base + skew + at[k] for k in range(4)))
    lib().vk_q8_quantize(_addr(x), n, c, fb, *a.ptrs)
    return a


class Mat(ctypes.Structure):
    """qdot.c's Mat: one matrix of a vk_q8_gemvs call."""
    _fields_ = [("fmt", ctypes.c_int32), ("pad", ctypes.c_int32), ("w", _P), ("row_bytes", _I), ("scales", _P),
                ("scale_stride", _I), ("order", _P), ("rows", _I), ("cols", _I), ("y", _P), ("y_stride", _I)]


_MATS: dict[int, tuple] = {}


def _mat(w) -> tuple:
    """(w's Mat, the arrays its pointers point into), made once a weight and
    dropped when the weight goes: a MoE step meets a new set of experts, and
    so a new _Call, every token."""
    got = _MATS.get(id(w))
    if got is not None:
        return got
    assert w.data.strides[1] == 1
    scales = np.ascontiguousarray(w.scales, np.float32) if w.fmt in ("int8", "int4-g64") else None
    order = None if w.order is None else np.ascontiguousarray(w.order, np.int64)
    m = Mat()
    m.fmt, m.w, m.row_bytes, m.rows, m.cols = FORMAT_IDS[w.fmt], _addr(w.data), w.data.strides[0], w.rows, w.cols
    m.scales = None if scales is None else _addr(scales)
    m.scale_stride = 0 if scales is None else scales.shape[1]
    m.order = None if order is None else _addr(order)
    got = _MATS[id(w)] = (m, scales, order)
    weakref.finalize(w, _MATS.pop, id(w), None)    # before its id can be another weight's
    return got


class _Call:
    """The Mat array of a tuple of weights; a call fills in only the outputs."""

    def __init__(self, ws):
        self.ws = ws
        self.keep = [_mat(w) for w in ws]                  # and ws: what the pointers point into
        self.mats = (Mat * len(ws))(*[k[0] for k in self.keep])

    def _outputs(self, counts) -> list[np.ndarray]:
        """Every output a view of one new buffer: one allocation and one
        address a call, not one a matrix (a MoE layer's call has 16)."""
        sizes = [n * w.rows for w, n in zip(self.ws, counts)]
        buf = np.empty(sum(sizes), np.float32)
        base, at, outs = _addr(buf), 0, []
        for m, w, n, size in zip(self.mats, self.ws, counts, sizes):
            m.y, m.y_stride = base + 4 * at, w.rows
            outs.append(buf[at:at + size].reshape(n, w.rows))
            at += size
        return outs

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        x = np.ascontiguousarray(x, dtype=np.float32)
        assert all(w.cols == x.shape[1] for w in self.ws)
        outs = self._outputs([x.shape[0]] * len(self.ws))
        if lib().vk_q8_gemvs(self.mats, len(self.ws), _addr(x), x.shape[0], THREADS):
            raise MemoryError("q8 GEMV: out of memory for its buffers")
        return outs

    def each(self, xs) -> list[np.ndarray]:
        xs = [np.ascontiguousarray(x, dtype=np.float32) for x in xs]
        assert len(xs) == len(self.ws) and all(w.cols == x.shape[1] for w, x in zip(self.ws, xs))
        outs = self._outputs([x.shape[0] for x in xs])
        addrs: dict[int, int] = {}          # an input given to several matrices: its address once
        for x in xs:
            if id(x) not in addrs:
                addrs[id(x)] = _addr(x)
        ptrs = (ctypes.c_void_p * len(xs))(*[addrs[id(x)] for x in xs])
        ns = (ctypes.c_int64 * len(xs))(*[x.shape[0] for x in xs])
        if lib().vk_q8_gemvs_each(self.mats, len(self.ws), ptrs, ns, THREADS):
            raise MemoryError("q8 GEMV: out of memory for its buffers")
        return outs


_CALLS: dict[tuple, _Call] = {}


def _call(ws) -> _Call:
    key = tuple(id(w) for w in ws)
    call = _CALLS.get(key)
    if call is None or any(a is not b for a, b in zip(call.ws, ws)):
        if len(_CALLS) >= 1024:                         # passing weights (a draft vocabulary's rows)
            _CALLS.clear()
        call = _CALLS[key] = _Call(tuple(ws))           # holds the weights: an id is not reused meanwhile
    return call


def gemvs(ws, x: np.ndarray) -> list[np.ndarray]:
    """[(n, w.rows) float32 for w in ws]: every row of x (n, cols), quantised
    per block inside the call, against every logical row of each weight."""
    return _call(ws)(x)


def gemvs_each(ws, xs) -> list[np.ndarray]:
    """[(len(x), w.rows) float32 for w, x in zip(ws, xs)]: each weight against
    its own input, all in one call (each row's bits as in gemv)."""
    return _call(ws).each(xs)


def gemv(w: QWeight, x: np.ndarray) -> np.ndarray:
    return gemvs((w,), x)[0]


# a Mat as 10 int64 words (fmt and pad share the first): plain integer rows, the fast NumPy paths
_WORDS = ctypes.sizeof(Mat) // 8
_Y = Mat.y.offset // 8
assert ctypes.sizeof(Mat) == 8 * _WORDS and Mat.y_stride.offset == 8 * (_Y + 1)


def mat_words(ws) -> tuple[np.ndarray, list]:
    """(the Mats of ws as an int64 array (len(ws), _WORDS), what their
    pointers point into): plain integer rows that NumPy indexes and compiled
    callers (jit_qdot) fill in, each output's stride its matrix's rows."""
    keep = [_mat(w) for w in ws]
    words = np.frombuffer(b"".join(bytes(k[0]) for k in keep), np.int64).reshape(len(ws), _WORDS).copy()
    words[:, _Y + 1] = [w.rows for w in ws]
    return words, keep


class Table:
    """The Mats of many weights of one shape (a MoE layer's gates and ups, or
    its downs) as one NumPy array: a call over any of them picks its rows by
    index, with no ctypes object made a matrix. The same C call, so the same
    bits as gemvs_each."""

    def __init__(self, ws):
        self.mats, self.keep = mat_words(ws)               # keep: what the pointers point into
        self.rows, cols = ws[0].rows, ws[0].cols
        assert all(w.rows == self.rows and w.cols == cols for w in ws)
        self.y_step = 4 * self.rows * np.arange(len(ws), dtype=np.int64)   # output j's offset in bytes
        self.x_step = 4 * cols * np.arange(len(ws), dtype=np.int64)        # input row j's
        self.ones, self.zeros = np.ones(len(ws), np.int64), np.zeros(len(ws), np.int64)
        self.ones_at = _addr(self.ones)

    def each(self, sel: np.ndarray, xs: np.ndarray, x_rows: int = 0) -> np.ndarray:
        """Weight sel[j] against one row of xs: xs[j] (xs (len(sel), cols)),
        or with x_rows=1 xs[0] for every j. Returns (len(sel), rows)."""
        n = len(sel)
        mats = self.mats[sel]
        assert xs.dtype == np.float32 and xs.flags.c_contiguous and xs.shape[0] == (1 if x_rows else n)
        y = np.empty((n, self.rows), np.float32)
        mats[:, _Y] = _addr(y) + self.y_step[:n]
        ptrs = _addr(xs) + (self.zeros if x_rows else self.x_step)[:n]
        if lib().vk_q8_gemvs_each(_addr(mats), n, _addr(ptrs), self.ones_at, THREADS):
            raise MemoryError("q8 GEMV: out of memory for its buffers")
        return y


__all__ = ["Q8Rows", "Table", "mat_words", "quantize", "gemvs", "gemvs_each", "gemv", "variant", "lib"]
