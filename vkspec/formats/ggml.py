"""ggml block formats: the executable definition of a GGUF weight's value.

A GGUF tensor is a sequence of blocks; each type packs ``block_elems`` values
into ``block_bytes`` bytes (an f16 scale or two, small integer quants). The
value of a weight is, by definition, what ``gguf.quants.dequantize`` (the
``gguf`` package, 0.19.0) returns for its block, bit for bit. Each
``dequantize_*`` here reproduces that package's float32 operations in its
order (listed per type below), so the same formula can be written in GLSL and
in the compiled CPU kernels and agree byte for byte:

======  =============================================
type    value of element e, in gguf's operation order
======  =============================================
F32     the 4 bytes as an IEEE float32
F16     the 2 bytes as an IEEE half, widened exactly
BF16    the 2 bytes as the top half of a float32
Q4_0    d * (q - 8)
Q4_1    (d * q) + m
Q5_0    d * (q - 16)
Q5_1    (d * q) + m
Q8_0    q * d
Q2_K    (d * sc) * q - (dmin * mn)
Q3_K    (d * (sc - 32)) * q
Q4_K    (d * sc) * q - (dmin * mn)
Q5_K    (d * sc) * q - (dmin * mn)
Q6_K    (d * sc) * (q - 32)
======  =============================================

d, dmin, m are f16 (widened exactly); sc, mn, q are small integers converted
exactly to float32. ``gguf`` computes every one of these in float32 (NumPy 2
keeps float32 * float32 in float32; no step widens to float64), with only
``*``, ``+`` and ``-``: no division, no transcendental. Q8_K is left out:
``gguf`` has no dequantize for it (it is llama.cpp's activation format).

Every product above is exact in float32: d has an 11-bit significand and the
integers at most 7 (a scale) + 5 (a quant) significant bits, so a product has
at most 23 (Q6_K; 21 for Q4_K), and the smallest nonzero one (2**-24) is far
above float32's denormals. Only the final ``+ m`` or ``- dmin * mn`` rounds.
So the grouping of the products cannot change a bit, and neither can a fused
multiply-add (RADV fuses ``fma()``): fma(a, b, c) rounds a*b + c once, as the
unfused form does when a*b is exact. Where two NaNs meet (a NaN scale and a
NaN m or dmin) the payload of the result is not defined even by gguf: NumPy
itself returns either operand's payload for the same ``x + m`` depending on
the array's shape (measured: one block gives m's, two give x's). A NaN stays a
NaN; its payload is not part of the definition. Every other bit is.

f16 is widened by integer bit manipulation (``f16_bits_to_f32``), because
GLSL and the compiled kernels have no half type. The compiled CPU decoders
(backends/cpu/jit_blocks.py) and the shaders (shaders/weights.glsl) write
these formulas again, one element at a time; tests/test_formats.py holds
them to this file over random and edge blocks.

Each type's layout is a per-element table (which byte, which shift), built by
walking the blocks the way llama.cpp's ``dequantize_row_*`` in ggml-quants.c
does, so the layout reads as that loop and the arithmetic is a few
whole-array lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

_TWO_M24 = np.float32(2.0 ** -24)      # f16 subnormal: integer mantissa * 2**-24, exact


# --- scalar fields --------------------------------------------------------------------

def f16_bits_to_f32(h):
    """Half-precision bit patterns (uint32 array, values < 2**16) -> float32, exactly.

    Normal: exponent rebiased by 127 - 15 = 112, mantissa shifted up 13.
    Subnormal (exponent 0): the integer mantissa times 2**-24, one exact
    multiply (the result is a normal float32); +-0 falls out of the same line.
    Inf/NaN (exponent 31): float32 exponent 255, the payload shifted up 13, not
    quieted (NumPy's own conversion does the same: all 65536 patterns tested).
    """
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    exp = (h >> np.uint32(10)) & np.uint32(0x1F)
    man = h & np.uint32(0x3FF)
    normal = sign | ((exp + np.uint32(112)) << np.uint32(23)) | (man << np.uint32(13))
    special = sign | np.uint32(0x7F800000) | (man << np.uint32(13))
    small = (man.astype(np.float32) * _TWO_M24).view(np.uint32) | sign
    bits = np.where(exp == np.uint32(0), small, np.where(exp == np.uint32(31), special, normal))
    return bits.view(np.float32)


def _u16(blocks, at):
    """The little-endian uint16 at byte `at` of every block, as uint32 (n,)."""
    return blocks[:, at].astype(np.uint32) | (blocks[:, at + 1].astype(np.uint32) << np.uint32(8))


def _f16(blocks, at):
    """The f16 at byte `at` of every block, widened: float32 (n, 1)."""
    n = blocks.shape[0]
    return f16_bits_to_f32(_u16(blocks, at)).reshape((n, 1))


def _field(blocks, byte, shift, mask):
    """Per element e: (blocks[:, byte[e]] >> shift[e]) & mask, as uint8 (n, len(byte))."""
    return (blocks[:, byte] >> shift) & mask


def _signed8(u):
    """uint8 -> the int8 it encodes, as int32."""
    return (u.astype(np.int32) ^ np.int32(128)) - np.int32(128)


def _k4_scales_mins(blocks, at):
    """Q4_K/Q5_K's eight 6-bit (scale, min) pairs packed in 12 bytes at `at`
    (get_scale_min_k4 in ggml-quants.c): uint8 (n, 8) each."""
    n = blocks.shape[0]
    lo = blocks[:, at:at + 4]          # scales 0-3 (low 6 bits), high 2 bits of scales 4-7
    mid = blocks[:, at + 4:at + 8]     # mins 0-3, high 2 bits of mins 4-7
    hi = blocks[:, at + 8:at + 12]     # low 4 bits of scales 4-7 and of mins 4-7
    sc = np.empty((n, 8), np.uint8)
    mn = np.empty((n, 8), np.uint8)
    sc[:, 0:4] = lo & np.uint8(63)
    mn[:, 0:4] = mid & np.uint8(63)
    sc[:, 4:8] = (hi & np.uint8(15)) | ((lo >> np.uint8(6)) << np.uint8(4))
    mn[:, 4:8] = (hi >> np.uint8(4)) | ((mid >> np.uint8(6)) << np.uint8(4))
    return sc, mn


def _q3_k_scales(blocks, at):
    """Q3_K's sixteen 6-bit scales packed in 12 bytes at `at`: low 4 bits in
    bytes 0-7 (low nibble for scales 0-7, high nibble for 8-15), high 2 bits
    in bytes 8-11 (scale s: byte 8 + s % 4, bits 2 * (s // 4)). uint8 (n, 16)."""
    n = blocks.shape[0]
    low = blocks[:, at:at + 8]
    high = blocks[:, at + 8:at + 12]
    sc = np.empty((n, 16), np.uint8)
    sc[:, 0:8] = low & np.uint8(15)
    sc[:, 8:16] = low >> np.uint8(4)
    sc[:, 0:4] = sc[:, 0:4] | ((high & np.uint8(3)) << np.uint8(4))
    sc[:, 4:8] = sc[:, 4:8] | (((high >> np.uint8(2)) & np.uint8(3)) << np.uint8(4))
    sc[:, 8:12] = sc[:, 8:12] | (((high >> np.uint8(4)) & np.uint8(3)) << np.uint8(4))
    sc[:, 12:16] = sc[:, 12:16] | (((high >> np.uint8(6)) & np.uint8(3)) << np.uint8(4))
    return sc


# --- layouts: per element, the byte and shift of its bits (ggml-quants.c's loops) -------

def _table(pairs):
    byte = np.array([b for b, _ in pairs], dtype=np.int64)
    shift = np.array([s for _, s in pairs], dtype=np.uint8)
    return byte, shift


def _nibbles32(qs_at):
    """Q4_0/Q4_1/Q5_0/Q5_1: y[j] = low nibble of qs[j], y[j + 16] = its high nibble."""
    return _table([(qs_at + j, 0) for j in range(16)] + [(qs_at + j, 4) for j in range(16)])


def _bits32(qh_at):
    """Q5_0/Q5_1: bit j of the little-endian uint32 qh is the 5th bit of y[j]."""
    return _table([(qh_at + j // 8, j % 8) for j in range(32)])


def _q2_q3_layout(qs_at):
    """Q2_K/Q3_K: two halves of 128 values; in each, 4 passes over the same 32
    bytes at shifts 0, 2, 4, 6. Returns the 2-bit field and, for Q3_K, the
    hmask bit of each value (byte l of hmask, bit 4 * half + pass)."""
    q, h = [], []
    for half in range(2):
        for pas in range(4):
            for l in range(32):
                q.append((qs_at + 32 * half + l, 2 * pas))
                h.append((l, 4 * half + pas))
    return _table(q), _table(h)


def _q4_q5_k_layout(qs_at):
    """Q4_K/Q5_K: four chunks of 64 values over 32 bytes each, low nibbles
    first; the 5th bit of value e (Q5_K) is bit e // 32 of qh byte e % 32."""
    q, h = [], []
    for chunk in range(4):
        for nib in range(2):
            for l in range(32):
                q.append((qs_at + 32 * chunk + l, 4 * nib))
                h.append((l, 2 * chunk + nib))
    return _table(q), _table(h)


def _q6_k_layout():
    """Q6_K: two halves of 128 values; value 32 * k + l of a half takes the
    nibble (ql byte 32 * (k % 2) + l, shift 4 * (k // 2)) and 2 high bits
    (qh byte l, shift 2 * k)."""
    lo, hi = [], []
    for half in range(2):
        for k in range(4):
            for l in range(32):
                lo.append((64 * half + 32 * (k % 2) + l, 4 * (k // 2)))
                hi.append((128 + 32 * half + l, 2 * k))
    return _table(lo), _table(hi)


_Q4_0_BYTE, _Q4_0_SHIFT = _nibbles32(2)
_Q4_1_BYTE, _Q4_1_SHIFT = _nibbles32(4)
_Q5_0_BYTE, _Q5_0_SHIFT = _nibbles32(6)
_Q5_0_HBYTE, _Q5_0_HSHIFT = _bits32(2)
_Q5_1_BYTE, _Q5_1_SHIFT = _nibbles32(8)
_Q5_1_HBYTE, _Q5_1_HSHIFT = _bits32(4)
(_Q2_K_BYTE, _Q2_K_SHIFT), _ = _q2_q3_layout(16)
(_Q3_K_BYTE, _Q3_K_SHIFT), (_Q3_K_HBYTE, _Q3_K_HSHIFT) = _q2_q3_layout(32)
(_Q4_K_BYTE, _Q4_K_SHIFT), _ = _q4_q5_k_layout(16)
(_Q5_K_BYTE, _Q5_K_SHIFT), (_Q5_K_HBYTE, _Q5_K_HSHIFT) = _q4_q5_k_layout(48)
_Q5_K_HBYTE = _Q5_K_HBYTE + 16
(_Q6_K_BYTE, _Q6_K_SHIFT), (_Q6_K_HBYTE, _Q6_K_HSHIFT) = _q6_k_layout()
_SUB16 = np.arange(256, dtype=np.int64) // 16       # K-quants: value e uses scale e // 16 ...
_SUB32 = np.arange(256, dtype=np.int64) // 32       # ... or e // 32


# --- the types ---------------------------------------------------------------------------

def dequantize_f32(blocks):
    """F32: (n, 4) little-endian bytes -> (n, 1), every bit kept (NaN payloads too)."""
    n = blocks.shape[0]
    bits = (blocks[:, 0].astype(np.uint32) | (blocks[:, 1].astype(np.uint32) << np.uint32(8))
            | (blocks[:, 2].astype(np.uint32) << np.uint32(16))
            | (blocks[:, 3].astype(np.uint32) << np.uint32(24)))
    return bits.view(np.float32).reshape((n, 1))


def dequantize_f16(blocks):
    """F16: (n, 2) -> (n, 1)."""
    return _f16(blocks, 0)


def dequantize_bf16(blocks):
    """BF16: (n, 2) -> (n, 1): the 16 bits become the top half of a float32."""
    n = blocks.shape[0]
    return (_u16(blocks, 0) << np.uint32(16)).view(np.float32).reshape((n, 1))


def dequantize_q4_0(blocks):
    """Q4_0, 18 bytes: d (f16), qs[16]. y = d * (q - 8)."""
    d = _f16(blocks, 0)
    q = _field(blocks, _Q4_0_BYTE, _Q4_0_SHIFT, np.uint8(15)).astype(np.int32) - np.int32(8)
    return d * q.astype(np.float32)


def dequantize_q4_1(blocks):
    """Q4_1, 20 bytes: d, m (f16), qs[16]. y = (d * q) + m, two roundings."""
    d = _f16(blocks, 0)
    m = _f16(blocks, 2)
    q = _field(blocks, _Q4_1_BYTE, _Q4_1_SHIFT, np.uint8(15))
    return d * q.astype(np.float32) + m


def dequantize_q5_0(blocks):
    """Q5_0, 22 bytes: d, qh (u32: 5th bits), qs[16]. y = d * (q - 16)."""
    d = _f16(blocks, 0)
    q = (_field(blocks, _Q5_0_BYTE, _Q5_0_SHIFT, np.uint8(15))
         | (_field(blocks, _Q5_0_HBYTE, _Q5_0_HSHIFT, np.uint8(1)) << np.uint8(4)))
    return d * (q.astype(np.int32) - np.int32(16)).astype(np.float32)


def dequantize_q5_1(blocks):
    """Q5_1, 24 bytes: d, m, qh, qs[16]. y = (d * q) + m."""
    d = _f16(blocks, 0)
    m = _f16(blocks, 2)
    q = (_field(blocks, _Q5_1_BYTE, _Q5_1_SHIFT, np.uint8(15))
         | (_field(blocks, _Q5_1_HBYTE, _Q5_1_HSHIFT, np.uint8(1)) << np.uint8(4)))
    return d * q.astype(np.float32) + m


def dequantize_q8_0(blocks):
    """Q8_0, 34 bytes: d, qs[32] (int8). y = q * d."""
    d = _f16(blocks, 0)
    q = _signed8(blocks[:, 2:34])
    return q.astype(np.float32) * d


def dequantize_q2_k(blocks):
    """Q2_K, 84 bytes: scales[16] (low nibble scale, high nibble min), qs[64]
    (2-bit), d, dmin. y = (d * sc) * q - (dmin * mn), 16 values per scale."""
    d = _f16(blocks, 80)
    dmin = _f16(blocks, 82)
    s = blocks[:, 0:16]
    dl = d * (s & np.uint8(15)).astype(np.float32)
    ml = dmin * (s >> np.uint8(4)).astype(np.float32)
    q = _field(blocks, _Q2_K_BYTE, _Q2_K_SHIFT, np.uint8(3)).astype(np.float32)
    return dl[:, _SUB16] * q - ml[:, _SUB16]


def dequantize_q3_k(blocks):
    """Q3_K, 110 bytes: hmask[32], qs[64] (2-bit), scales[12] (6-bit), d.
    q = low 2 bits - 4 where the hmask bit is clear; y = (d * (sc - 32)) * q."""
    d = _f16(blocks, 108)
    sc = _q3_k_scales(blocks, 96).astype(np.int32) - np.int32(32)
    dl = d * sc.astype(np.float32)
    low = _field(blocks, _Q3_K_BYTE, _Q3_K_SHIFT, np.uint8(3)).astype(np.int32)
    high = _field(blocks, _Q3_K_HBYTE, _Q3_K_HSHIFT, np.uint8(1)).astype(np.int32)
    q = low - ((high ^ np.int32(1)) << np.int32(2))
    return dl[:, _SUB16] * q.astype(np.float32)


def dequantize_q4_k(blocks):
    """Q4_K, 144 bytes: d, dmin, scales[12] (6-bit scale/min pairs), qs[128].
    y = (d * sc) * q - (dmin * mn), 32 values per pair."""
    d = _f16(blocks, 0)
    dmin = _f16(blocks, 2)
    sc, mn = _k4_scales_mins(blocks, 4)
    dl = d * sc.astype(np.float32)
    ml = dmin * mn.astype(np.float32)
    q = _field(blocks, _Q4_K_BYTE, _Q4_K_SHIFT, np.uint8(15)).astype(np.float32)
    return dl[:, _SUB32] * q - ml[:, _SUB32]


def dequantize_q5_k(blocks):
    """Q5_K, 176 bytes: d, dmin, scales[12], qh[32] (5th bits), qs[128].
    y = (d * sc) * q - (dmin * mn)."""
    d = _f16(blocks, 0)
    dmin = _f16(blocks, 2)
    sc, mn = _k4_scales_mins(blocks, 4)
    dl = d * sc.astype(np.float32)
    ml = dmin * mn.astype(np.float32)
    q = (_field(blocks, _Q5_K_BYTE, _Q5_K_SHIFT, np.uint8(15))
         | (_field(blocks, _Q5_K_HBYTE, _Q5_K_HSHIFT, np.uint8(1)) << np.uint8(4)))
    return dl[:, _SUB32] * q.astype(np.float32) - ml[:, _SUB32]


def dequantize_q6_k(blocks):
    """Q6_K, 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16]
    (int8), d. y = (d * sc) * (q - 32), 16 values per scale."""
    d = _f16(blocks, 208)
    dl = d * _signed8(blocks[:, 192:208]).astype(np.float32)
    q = (_field(blocks, _Q6_K_BYTE, _Q6_K_SHIFT, np.uint8(15))
         | (_field(blocks, _Q6_K_HBYTE, _Q6_K_HSHIFT, np.uint8(3)) << np.uint8(4)))
    return dl[:, _SUB16] * (q.astype(np.int32) - np.int32(32)).astype(np.float32)


# --- the table ----------------------------------------------------------------------------

@dataclass(frozen=True)
class GgmlType:
    name: str
    type_id: int            # ggml_type / gguf.GGMLQuantizationType value
    block_elems: int
    block_bytes: int
    dequantize: Callable    # uint8 (n_blocks, block_bytes) -> float32 (n_blocks, block_elems)


TYPES: dict[str, GgmlType] = {t.name: t for t in (
    GgmlType("F32", 0, 1, 4, dequantize_f32),
    GgmlType("F16", 1, 1, 2, dequantize_f16),
    GgmlType("Q4_0", 2, 32, 18, dequantize_q4_0),
    GgmlType("Q4_1", 3, 32, 20, dequantize_q4_1),
    GgmlType("Q5_0", 6, 32, 22, dequantize_q5_0),
    GgmlType("Q5_1", 7, 32, 24, dequantize_q5_1),
    GgmlType("Q8_0", 8, 32, 34, dequantize_q8_0),
    GgmlType("Q2_K", 10, 256, 84, dequantize_q2_k),
    GgmlType("Q3_K", 11, 256, 110, dequantize_q3_k),
    GgmlType("Q4_K", 12, 256, 144, dequantize_q4_k),
    GgmlType("Q5_K", 13, 256, 176, dequantize_q5_k),
    GgmlType("Q6_K", 14, 256, 210, dequantize_q6_k),
    GgmlType("BF16", 30, 1, 2, dequantize_bf16),
)}
BY_ID: dict[int, GgmlType] = {t.type_id: t for t in TYPES.values()}


def _agree_with_gguf():
    """The numbers above are written out so the table reads on its own; the
    gguf package is the authority and must agree."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    for t in TYPES.values():
        g = GGMLQuantizationType[t.name]
        assert int(g) == t.type_id, (t.name, int(g))
        assert GGML_QUANT_SIZES[g] == (t.block_elems, t.block_bytes), (t.name, GGML_QUANT_SIZES[g])


_agree_with_gguf()


def dequantize(data, type_name: str):
    """A tensor's bytes (any uint8 array of whole blocks) -> float32 values, flat."""
    t = TYPES[type_name]
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape((-1, t.block_bytes))
    return t.dequantize(blocks).reshape(-1)
