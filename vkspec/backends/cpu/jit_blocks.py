"""Weight formats on the CPU: each stored row is turned into its float32 values
(formats.matrix.dequantize's, bit for bit) in a small buffer, then dotted with
every row of the block in the canonical order (jit_dot). The weight's bytes
are read once per GEMV, whatever the number of rows.

The value formulas follow formats/ggml.py and formats/quant.py operation for
operation (``(d * sc) * q - dmin * mn`` ...); ggml-quants.c's loops give the
layout. tests/test_formats.py holds every format here to those definitions
over random and edge blocks (subnormal, infinite and NaN scales, extreme
quants), so a slip in a shift or a mask fails there.

One kernel serves every format (an integer code picks the row decoder), so
numba compiles and caches it once.
"""

from __future__ import annotations

import numpy as np
from . import numba_cache  # noqa: I001  (first: where numba caches)
from numba import njit, prange

from ... import exact
from ...formats.matrix import FP8_E4M3
from . import jit, jit_math  # noqa: F401  (jit_math gives numba exact.bits / exact.from_bits)
from .jit_dot import DOT_ROWS, MAX_ROWS, chunk_rows, claim, dot_rows, threads
from .jit_ir_groups import CODES
from .jit_qdot import bind_float, float_rows, float_rows_bound
from .jit_unpack import (FUSED, FUSED_ROWS, ORDERED, Q4_0, Q4_1, Q4_K, Q8_0, STAGED, gemv_fused, order_staged,
                         order_x, unpack)

F = np.float32
BLOCK = 16                  # weight rows per parallel work item
_TWO_M24 = F(2.0 ** -24)
_JIT = dict(boundscheck=False, error_model="numpy", cache=True)
FLOATS = ("f16", "bf16")    # block formats the library's float_rows reads (jit_qdot.bind_float)


@njit(**_JIT)
def _f16(row, at):
    """The f16 at byte `at`, widened exactly (formats.ggml.f16_bits_to_f32)."""
    h = np.uint32(row[at]) | (np.uint32(row[at + 1]) << np.uint32(8))
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    e = (h >> np.uint32(10)) & np.uint32(0x1F)
    man = h & np.uint32(0x3FF)
    if e == 0:
        v = F(man) * _TWO_M24
        return exact.from_bits(exact.bits(v) | sign)
    if e == 31:
        return exact.from_bits(sign | np.uint32(0x7F800000) | (man << np.uint32(13)))
    return exact.from_bits(sign | ((e + np.uint32(112)) << np.uint32(23)) | (man << np.uint32(13)))


@njit(**_JIT)
def _b(row, i):
    """Byte i as a signed 64-bit integer: numba types uint8 op int as a float
    where an unsigned 64-bit value meets a signed one, so every byte is made
    signed before any bit operation."""
    return np.int64(row[i])


@njit(**_JIT)
def _s8(u):
    return np.int32(np.int8(np.uint8(u)))


@njit(**_JIT)
def _k4(q, at, j):
    """Q4_K/Q5_K's 6-bit (scale, min) pair j from the 12 bytes at `at`."""
    if j < 4:
        return np.int32(_b(q, at + j) & 63), np.int32(_b(q, at + j + 4) & 63)
    return (np.int32((_b(q, at + j + 4) & 15) | ((_b(q, at + j - 4) >> 6) << 4)),
            np.int32((_b(q, at + j + 4) >> 4) | ((_b(q, at + j) >> 6) << 4)))


@njit(**_JIT)
def _q3_scale(q, at, s):
    low = (_b(q, at + s) & 15) if s < 8 else (_b(q, at + s - 8) >> 4)
    high = (_b(q, at + 8 + s % 4) >> (2 * (s // 4))) & 3
    return np.int32(low | (high << 4)) - np.int32(32)


@njit(**_JIT)
def decode_row(code, row, scales, cols, out):
    """out[:cols] = the values of one stored row (formats.matrix.dequantize)."""
    if code == 0:                                               # f32: its own bits
        for j in range(cols):
            out[j] = exact.from_bits(np.uint32(_b(row, 4 * j)) | (np.uint32(_b(row, 4 * j + 1)) << np.uint32(8))
                                     | (np.uint32(_b(row, 4 * j + 2)) << np.uint32(16))
                                     | (np.uint32(_b(row, 4 * j + 3)) << np.uint32(24)))
    elif code == 1 or code == 2:                                  # f16, bf16
        for j in range(cols):
            if code == 1:
                out[j] = _f16(row, 2 * j)
            else:
                out[j] = exact.from_bits((np.uint32(_b(row, 2 * j)) | (np.uint32(_b(row, 2 * j + 1)) << np.uint32(8)))
                                      << np.uint32(16))
    elif code == 3:                                             # int8: q * scale
        s = scales[0]
        for j in range(cols):
            out[j] = F(_s8(_b(row, j))) * s
    elif code == 4:                                             # int4-g64: (nibble - 8) * scale
        for j in range(cols):
            b = _b(row, j >> 1)
            q = np.int32((b >> 4) if j & 1 else (b & 15)) - np.int32(8)
            out[j] = F(q) * scales[j >> 6]
    elif code == 5:                                             # fp8 e4m3 * block scale
        for j in range(cols):
            out[j] = FP8_E4M3[_b(row, j)] * scales[j >> 7]
    elif code == 7:
        _q4_1(row, cols, out)
    elif code == 6:
        _q4_0(row, cols, out)
    elif code == 10:
        _q8_0(row, cols, out)
    elif code <= 10:
        _decode_32(code, row, cols, out)
    elif code == 13:
        _q4_k(row, cols, out)
    elif code == 15:
        _q6_k(row, cols, out)
    else:
        _decode_256(code, row, cols, out)


# The formats most files use, their blocks' values from vector IR
# (jit_unpack): the same formulas as _decode_32 / _decode_256
# (tests/test_formats.py holds both to the definition).

@njit(**_JIT)
def _q4_0(row, cols, out):
    for b in range(cols // 32):
        o = b * 18
        unpack(Q4_0, row, o + 2, out, b * 32, _f16(row, o), F(0.0), 0)


@njit(**_JIT)
def _q4_1(row, cols, out):
    for b in range(cols // 32):
        o = b * 20
        unpack(Q4_1, row, o + 4, out, b * 32, _f16(row, o), _f16(row, o + 2), 0)


@njit(**_JIT)
def _q8_0(row, cols, out):
    for b in range(cols // 32):
        o = b * 34
        unpack(Q8_0, row, o + 2, out, b * 32, _f16(row, o), F(0.0), 0)


@njit(**_JIT)
def _q4_k(row, cols, out):
    for b in range(cols // 256):
        o, y = b * 144, b * 256
        d, dmin = _f16(row, o), _f16(row, o + 2)
        for pair in range(8):
            sc, mn = _k4(row, o + 4, pair)
            unpack(Q4_K, row, o + 16 + 32 * (pair // 2), out, y + 32 * pair, d * F(sc), dmin * F(mn),
                   4 * (pair % 2))


@njit(**_JIT)
def _q6_k(row, cols, out):
    for b in range(cols // 256):
        o, y = b * 210, b * 256
        d = _f16(row, o + 208)
        for half in range(2):
            for k in range(4):
                lo_at = o + 64 * half + 32 * (k % 2)
                hi_at = o + 128 + 32 * half
                lo_shift, hi_shift = np.uint8(4 * (k // 2)), np.uint8(2 * k)
                for g in range(2):                              # 16 values per scale
                    dl = d * F(np.int8(row[o + 192 + 8 * half + 2 * k + g]))
                    for l in range(16 * g, 16 * g + 16):
                        q = (((row[lo_at + l] >> lo_shift) & np.uint8(15))
                             | (((row[hi_at + l] >> hi_shift) & np.uint8(3)) << np.uint8(4)))
                        out[y + 128 * half + 32 * k + l] = dl * F(np.int32(q) - np.int32(32))


@njit(**_JIT)
def _decode_32(code, row, cols, out):
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: blocks of 32."""
    size = (18, 20, 22, 24, 34)[code - 6]
    for b in range(cols // 32):
        o, y = b * size, b * 32
        d = _f16(row, o)
        if code == 10:                                          # q8_0: q * d
            for j in range(32):
                out[y + j] = F(_s8(_b(row, o + 2 + j))) * d
            continue
        m = _f16(row, o + 2) if code == 7 or code == 9 else F(0.0)
        qs = o + (2, 4, 6, 8)[code - 6]
        qh = np.uint32(0)
        if code == 8 or code == 9:
            at = o + (2 if code == 8 else 4)
            qh = (np.uint32(_b(row, at)) | (np.uint32(_b(row, at + 1)) << np.uint32(8))
                  | (np.uint32(_b(row, at + 2)) << np.uint32(16)) | (np.uint32(_b(row, at + 3)) << np.uint32(24)))
        for j in range(16):
            lo = np.int32(_b(row, qs + j) & 15)
            hi = np.int32(_b(row, qs + j) >> 4)
            if code == 8 or code == 9:
                lo |= np.int32(((qh >> np.uint32(j)) & np.uint32(1)) << np.uint32(4))
                hi |= np.int32(((qh >> np.uint32(j + 16)) & np.uint32(1)) << np.uint32(4))
            if code == 6:
                out[y + j], out[y + j + 16] = d * F(lo - 8), d * F(hi - 8)
            elif code == 8:
                out[y + j], out[y + j + 16] = d * F(lo - 16), d * F(hi - 16)
            else:                                               # q4_1, q5_1: (d * q) + m
                out[y + j], out[y + j + 16] = d * F(lo) + m, d * F(hi) + m


@njit(**_JIT)
def _decode_256(code, row, cols, out):
    """Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: blocks of 256."""
    size = (84, 110, 144, 176, 210)[code - 11]
    for b in range(cols // 256):
        o, y = b * size, b * 256
        if code == 11:                                          # q2_k: (d * sc) * q - (dmin * mn)
            d, dmin = _f16(row, o + 80), _f16(row, o + 82)
            for e in range(256):
                half, rest = e // 128, e % 128
                pas, l = rest // 32, rest % 32
                s = _b(row, o + e // 16)
                q = (_b(row, o + 16 + 32 * half + l) >> (2 * pas)) & 3
                out[y + e] = (d * F(s & 15)) * F(q) - dmin * F(s >> 4)
        elif code == 12:                                        # q3_k: (d * (sc - 32)) * q
            d = _f16(row, o + 108)
            for e in range(256):
                half, rest = e // 128, e % 128
                pas, l = rest // 32, rest % 32
                low = np.int32((_b(row, o + 32 + 32 * half + l) >> (2 * pas)) & 3)
                hbit = (_b(row, o + l) >> (4 * half + pas)) & 1
                q = low - (np.int32(0) if hbit else np.int32(4))
                out[y + e] = (d * F(_q3_scale(row, o + 96, e // 16))) * F(q)
        elif code == 13 or code == 14:                          # q4_k, q5_k
            d, dmin = _f16(row, o), _f16(row, o + 2)
            qs = o + (16 if code == 13 else 48)
            for e in range(256):
                chunk, rest = e // 64, e % 64
                nib, l = rest // 32, rest % 32
                sc, mn = _k4(row, o + 4, e // 32)
                q = np.int32((_b(row, qs + 32 * chunk + l) >> (4 * nib)) & 15)
                if code == 14:
                    q |= np.int32(((_b(row, o + 16 + l) >> (2 * chunk + nib)) & 1) << 4)
                out[y + e] = (d * F(sc)) * F(q) - dmin * F(mn)
        else:                                                   # q6_k: (d * sc) * (q - 32)
            d = _f16(row, o + 208)
            for e in range(256):
                half, rest = e // 128, e % 128
                k, l = rest // 32, rest % 32
                lo = (_b(row, o + 64 * half + 32 * (k % 2) + l) >> (4 * (k // 2))) & 15
                hi = (_b(row, o + 128 + 32 * half + l) >> (2 * k)) & 3
                q = np.int32(lo | (hi << 4)) - np.int32(32)
                out[y + e] = (d * F(_s8(_b(row, o + 192 + e // 16)))) * F(q)


@njit(inline="always", boundscheck=False, error_model="numpy")
def _rows(code, data, scales, x, xp, out, lo, hi):
    """out[r, m] = dot(x[r], row m's values) for stored rows lo <= m < hi; up
    to DOT_ROWS rows of x share each decoded weight vector (jit_dot.dot_rows).
    xp: x in the block kernels' order (order_x, order_staged), where they run."""
    n, cols = x.shape[0], x.shape[1]
    if n <= FUSED_ROWS and FUSED[code]:              # decoded onto the lanes, no buffer (jit_ir_blocks)
        gemv_fused(code, data, lo, hi, xp, 0, n, out)
        return
    if code <= 2 and float_rows_bound():             # f32, f16, bf16: widened in registers (float_dot.h)
        float_rows(code, data, lo, hi, x, out)
        return
    buf = np.empty(cols, F)
    got = np.empty(MAX_ROWS, F)
    for m in range(lo, hi):
        decode_row(code, data[m], scales[m], cols, buf)
        r = 0
        while r < n:
            c = chunk_rows(n - r, DOT_ROWS)
            dot_rows(buf, x, r, c, got)
            for j in range(c):
                out[r + j, m] = got[j]
            r += c


@njit(inline="always", boundscheck=False, error_model="numpy")
def _rows_to(code, data, scales, x, xp, out, lo, hi, dest):
    """_rows, each stored row m's outputs written to column dest[m] of out
    (no dest: column m). A file's row order (QWeight.order) is undone here,
    in the parallel loop, rather than by a NumPy gather after each call."""
    if dest.shape[0] == 0:
        _rows(code, data, scales, x, xp, out, lo, hi)
        return
    tmp = np.empty((x.shape[0], int(hi)), F)         # columns lo..hi-1 used
    _rows(code, data, scales, x, xp, tmp, lo, hi)
    for r in range(x.shape[0]):
        for m in range(lo, hi):
            out[r, dest[m]] = tmp[r, m]


@njit(parallel=True, **_JIT)
def _gemv(codes, d0, d1, d2, s0, s1, s2, p0, p1, p2, x, nw, eps, up, act, o0, o1, o2):
    """o_i[r, dest_i[m]] = dot(x[r], row m's values of matrix i) for every
    stored row m of the matrices i < len(codes) (1 to 3), in one parallel
    loop over all their row blocks: a layer's q, k and v (or gate and up)
    take one call. One kernel for any count, because each compiled kernel
    links its own copy of the block kernels' machine code (jit_ir_blocks): a
    second one cost ~30 MB of resident memory.

    x is first replaced by rmsnorm(x, nw, eps) where nw is not empty, or by
    ELEMENTWISE[act](x) * up where up is not empty (jit_math's kernels, so
    the same bits): one call less between kernels, each of which costs its
    Python and its dispatch.

    Each thread first computes its own fixed share of the row blocks (three
    quarters of them in all), then takes the rest from one shared count
    (jit_dot.claim), half of what is left over the workers at a time, so a
    core that is slower for a while (another program on it, an efficiency
    core, a busy neighbour of a guest) no longer holds the others at the
    end of every GEMV (the same minima as a fixed half each, better medians
    on a noisy host; every block taken from the count cost more). Each
    block is still one thread's, so no bit moves."""
    if nw.shape[0]:
        xn = np.empty_like(x)
        jit_math._rms_rows(x, nw, x, eps, F(1.0 / x.shape[1]), False, xn)
        x = xn
    elif up.shape[0]:
        xa = np.empty_like(x)
        jit_math._elementwise_kernel(x.reshape(-1), xa.reshape(-1), act, up.reshape(-1))
        x = xa
    count = codes.shape[0]
    xp = x
    if x.shape[0] <= FUSED_ROWS and x.shape[1] % 32 == 0:
        if STAGED[x.shape[0]]:
            xp = np.empty_like(x)
            order_staged(x, xp)
        elif ORDERED:
            xp = np.empty_like(x)
            order_x(x, xp)
    b0 = (d0.shape[0] + BLOCK - 1) // BLOCK
    b1 = (d1.shape[0] + BLOCK - 1) // BLOCK if count > 1 else 0
    b2 = (d2.shape[0] + BLOCK - 1) // BLOCK if count > 2 else 0
    total = b0 + b1 + b2
    workers = min(threads(), total)
    share = total * 3 // (4 * workers)              # each worker's own first blocks: three quarters in all
    taken = np.full(1, share * workers, np.int64)    # the rest are taken from one count as workers free up
    for w in prange(workers):
        first, size = w * share, share
        while True:
            for item in range(first, min(first + size, total)):
                code, data, sc, dest, out, b = codes[0], d0, s0, p0, o0, item
                if item >= b0 + b1:
                    code, data, sc, dest, out, b = codes[2], d2, s2, p2, o2, item - b0 - b1
                elif item >= b0:
                    code, data, sc, dest, out, b = codes[1], d1, s1, p1, o1, item - b0
                _rows_to(code, data, sc, x, xp, out, b * BLOCK, min(data.shape[0], b * BLOCK + BLOCK), dest)
            size = max(1, (total - taken[0]) // (2 * workers))      # guided: half of what is left over the workers
            first = claim(taken, size)
            if first >= total:
                break


_NO_SCALES: dict[int, np.ndarray] = {}
_STORED = np.zeros(0, np.int64)                                 # no dest: outputs in storage order


def scales_2d(w) -> np.ndarray:
    """The weight's outside scales as float32 (rows, >= 1), or zeros (rows, 1)
    for formats that keep their scales in the blocks (one array per row count,
    made once: a GEMV is called ~200 times per token)."""
    if w.scales.size:
        return np.ascontiguousarray(w.scales, dtype=F)
    rows = w.data.shape[0]
    if rows not in _NO_SCALES:
        _NO_SCALES[rows] = np.zeros((rows, 1), F)
    return _NO_SCALES[rows]


def kernel_args(w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data, scales, dest) as the compiled kernel takes them; dest[m] is the
    logical row of stored row m (QWeight.order inverted), empty where the
    two agree."""
    dest = _STORED
    if w.order is not None:
        dest = np.empty(w.rows, np.int64)
        dest[w.order] = np.arange(w.rows)
    return np.ascontiguousarray(w.data), scales_2d(w), dest


def _own(w, data, scales) -> bool:
    """Whether the kernel's arrays are the weight's own (no converted copy)."""
    return data is w.data and (scales is w.scales or not w.scales.size)


def gemv(w, x: np.ndarray, logical: bool = False) -> np.ndarray:
    """(n, cols) rows -> (n, rows): every stored row of w, in storage order
    (logical: in the forward pass's order, QWeight.order undone)."""
    if w.fmt == "f32":                                          # no decoding: the values are the bytes
        out = jit.gemv(w.data.view(F), x)
        return out[:, w.order] if logical and w.order is not None else out
    return gemv_many([w], x, logical)[0]


_NONE1, _NONE2 = np.zeros(0, F), np.zeros((0, 1), F)
_NO_PROLOGUE = (_NONE1, F(0), _NONE2, 0)                       # _gemv's nw, eps, up, act: x as it is


def gemv_many(ws, x: np.ndarray, logical: bool = False, norm=None, up=None, act: str = "silu") -> list[np.ndarray]:
    """[gemv(w, x, logical) for w in ws], up to three matrices per compiled
    call (none of them f32); x is first rmsnorm(x, *norm) where norm = (w,
    eps) is given, or act(x) * up where up is (jit_math.ELEMENTWISE names)."""
    x = np.ascontiguousarray(x, dtype=F)
    pro = _NO_PROLOGUE
    if len(ws) > 3 and (norm is not None or up is not None):    # more than one call: the prologue once, here
        x = (jit_math.rmsnorm(x, *norm) if norm is not None
             else jit_math.ELEMENTWISE[jit_math.ELEMENTWISE_OPS[act]](x, times=up))
    elif norm is not None:
        pro = (jit_math._weight(norm[0], x.shape[1]), F(norm[1]), _NONE2, 0)
    elif up is not None:
        pro = (_NONE1, F(0), np.ascontiguousarray(up, dtype=F).reshape(x.shape), jit_math.ELEMENTWISE_OPS[act])
    n, outs = x.shape[0], []
    if any(w.fmt in FLOATS for w in ws):
        bind_float()
    for i in range(0, len(ws), 3):
        args, rows = _call_args(ws[i:i + 3], logical)
        got = [np.empty((n, r), F) for r in rows]
        _gemv(*args, x, *pro, *got, *got[:1] * (3 - len(got)))  # unused slots repeat the first matrix
        outs += got
    return outs


def _call_args(part, logical: bool):
    """The compiled call's arguments for one to three matrices, less x and
    the outputs, and their stored row counts: made once per list and kept on
    its first matrix (preparing them on every call was a quarter of a GEMV's
    wrapper, paid ~120 times a token). The entry holds the matrices, so no
    id in its key can be another object's; a list whose arrays had to be
    converted is never kept (a weight lives once)."""
    calls = part[0].__dict__.setdefault("_calls", {})
    key = (tuple(map(id, part)), logical)
    got = calls.get(key)
    if got is None:
        args = [kernel_args(w) for w in part]
        own = all(_own(w, d, sc) for w, (d, sc, _) in zip(part, args))
        if not logical:
            args = [(d, sc, _STORED) for d, sc, _ in args]
        args += args[:1] * (3 - len(part))                      # unused slots repeat the first matrix
        codes = np.array([CODES[w.fmt] for w in part], np.int64)
        got = (tuple(part), (codes, *(a[0] for a in args), *(a[1] for a in args), *(a[2] for a in args)),
               [w.data.shape[0] for w in part])
        if own:
            calls[key] = got
    return got[1], got[2]


def decode(w, ids=None) -> np.ndarray:
    """The values of logical rows ``ids`` (formats.matrix.dequantize of
    w.take(ids): an embedding's rows, straight from the table), or of every
    stored row (tests: the decoders against the definitions)."""
    rows = np.arange(w.data.shape[0]) if ids is None else np.asarray(ids, np.int64).reshape(-1)
    if ids is not None and w.order is not None:
        rows = w.order[rows]
    out = np.empty((rows.shape[0], w.cols), F)
    _decode_rows(CODES[w.fmt], w.data, scales_2d(w), np.ascontiguousarray(rows, np.int64), w.cols, out)
    return out


@njit(**_JIT)
def _decode_rows(code, data, scales, rows, cols, out):
    for i in range(rows.shape[0]):
        decode_row(code, data[rows[i]], scales[rows[i]], cols, out[i])


def machine_code() -> str:
    """Every CPU kernel's assembly (jit.machine_code, the attention's) and the block GEMV's,
    whose every format's decoder is inlined (numba_cache.machine_code)."""
    d, sc, o = np.zeros((jit.BLOCK, 144), np.uint8), np.zeros((jit.BLOCK, 1), F), np.empty((2, jit.BLOCK), F)
    p = np.arange(jit.BLOCK)[::-1].copy()
    example = (np.array([3]), d, d, d, sc, sc, sc, p, p, p, np.zeros((2, 256), F), np.ones(256, F), F(1e-6),
               np.zeros((2, 256), F), 5, o, o, o)
    from . import jit_attend, jit_unpack
    return "\n".join([jit.machine_code(), jit_unpack.machine_code(), jit_attend.machine_code()]
                     + numba_cache.machine_code(_gemv, *example))
