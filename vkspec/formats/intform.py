"""A quantised weight as integers: what the q8 definition multiplies.

Every block format vkspec reads stores, for each float block of ``FB``
columns (32, or 256 for the K-quants), one or two float scales and small
integers. Written as integers, element e's value is

    d * w[e]                     Q4_0, Q5_0, Q8_0, Q3_K, Q6_K, int8, int4-g64
    d * w[e] + m                 Q4_1, Q5_1   (the "_1" formats: an added min)
    d * w[e] - dmin * mn[g(e)]   Q2_K, Q4_K, Q5_K  (a min per group of 16)

with w = sc * (q - z) an exact integer (sc the 4/6/8-bit sub-block scale, z
the format's zero point) and d, m, dmin the block's widened f16 scales (or
vkspec's own float32 ones). Mathematically these are the values of
formats/ggml.py and matrix.dequantize; the q8 definition (exact.q8_block_sums,
exact.q8_combine) takes the integers exactly and rounds only where its float
part says.

The compiled kernel (backends/cpu/csrc/qdot.c) decodes the same fields from
the same bytes; tests/test_q8.py holds it to these arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import ggml
from .matrix import QWeight

K_TYPES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
BLOCK32_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "int8", "int4-g64")
Q8_FORMATS = BLOCK32_TYPES + K_TYPES          # what --activations q8 applies to


@dataclass
class IntForm:
    """Rows of a weight as integers. Shapes for r rows, c columns, B float
    blocks (c / fb) and G min groups (c / 16):

    w (r, c) int32; d (r, B) float32; m (r, B) float32 or None (the "_1"
    min, or dmin); mn (r, G) int32 or None (K-quant mins per 16 columns;
    the "_1" formats' min multiplies the block's whole sum: mn is None);
    sign: +1 (m added) or -1 (dmin * mn subtracted)."""
    fb: int
    w: np.ndarray
    d: np.ndarray
    m: np.ndarray | None = None
    mn: np.ndarray | None = None
    sign: int = 1


def block_size(fmt: str) -> int:
    """Columns of one float block, and so of one q8 activation block."""
    return 256 if fmt in K_TYPES else 32


def supports(w: QWeight) -> bool:
    return w.fmt in Q8_FORMATS and w.cols % block_size(w.fmt) == 0


def _ints(x) -> np.ndarray:
    return np.asarray(x).astype(np.int32)


def _block32(blocks, fmt):
    """(w (n, 32), d (n, 1), m (n, 1) or None) of ggml's 32-column types."""
    d = ggml._f16(blocks, 0)
    if fmt == "q8_0":
        return ggml._signed8(blocks[:, 2:34]), d, None
    if fmt == "q4_0":
        return _ints(ggml._field(blocks, ggml._Q4_0_BYTE, ggml._Q4_0_SHIFT, np.uint8(15))) - 8, d, None
    if fmt == "q4_1":
        return _ints(ggml._field(blocks, ggml._Q4_1_BYTE, ggml._Q4_1_SHIFT, np.uint8(15))), d, ggml._f16(blocks, 2)
    if fmt == "q5_0":
        q = (ggml._field(blocks, ggml._Q5_0_BYTE, ggml._Q5_0_SHIFT, np.uint8(15))
             | (ggml._field(blocks, ggml._Q5_0_HBYTE, ggml._Q5_0_HSHIFT, np.uint8(1)) << np.uint8(4)))
        return _ints(q) - 16, d, None
    q = (ggml._field(blocks, ggml._Q5_1_BYTE, ggml._Q5_1_SHIFT, np.uint8(15))
         | (ggml._field(blocks, ggml._Q5_1_HBYTE, ggml._Q5_1_HSHIFT, np.uint8(1)) << np.uint8(4)))
    return _ints(q), d, ggml._f16(blocks, 2)


def _k_quant(blocks, fmt):
    """(w (n, 256), d (n, 1), dmin (n, 1) or None, mn (n, 16) or None)."""
    sub16, sub32 = ggml._SUB16, ggml._SUB32
    if fmt == "q2_k":
        s = blocks[:, 0:16]
        q = _ints(ggml._field(blocks, ggml._Q2_K_BYTE, ggml._Q2_K_SHIFT, np.uint8(3)))
        return _ints(s & np.uint8(15))[:, sub16] * q, ggml._f16(blocks, 80), ggml._f16(blocks, 82), \
            _ints(s >> np.uint8(4))
    if fmt == "q3_k":
        sc = _ints(ggml._q3_k_scales(blocks, 96)) - 32
        low = _ints(ggml._field(blocks, ggml._Q3_K_BYTE, ggml._Q3_K_SHIFT, np.uint8(3)))
        high = _ints(ggml._field(blocks, ggml._Q3_K_HBYTE, ggml._Q3_K_HSHIFT, np.uint8(1)))
        return sc[:, sub16] * (low + 4 * high - 4), ggml._f16(blocks, 108), None, None
    if fmt == "q6_k":
        q = (ggml._field(blocks, ggml._Q6_K_BYTE, ggml._Q6_K_SHIFT, np.uint8(15))
             | (ggml._field(blocks, ggml._Q6_K_HBYTE, ggml._Q6_K_HSHIFT, np.uint8(3)) << np.uint8(4)))
        sc = ggml._signed8(blocks[:, 192:208])
        return sc[:, sub16] * (_ints(q) - 32), ggml._f16(blocks, 208), None, None
    sc, mn = ggml._k4_scales_mins(blocks, 4)
    if fmt == "q4_k":
        q = ggml._field(blocks, ggml._Q4_K_BYTE, ggml._Q4_K_SHIFT, np.uint8(15))
    else:
        q = (ggml._field(blocks, ggml._Q5_K_BYTE, ggml._Q5_K_SHIFT, np.uint8(15))
             | (ggml._field(blocks, ggml._Q5_K_HBYTE, ggml._Q5_K_HSHIFT, np.uint8(1)) << np.uint8(4)))
    mn16 = np.repeat(_ints(mn), 2, axis=1)           # a min per 32 columns is the same min for both 16s
    return _ints(sc)[:, sub32] * _ints(q), ggml._f16(blocks, 0), ggml._f16(blocks, 2), mn16


def int_form(w: QWeight, r0: int = 0, r1: int | None = None) -> IntForm:
    """Logical rows r0..r1-1 of a weight in one of Q8_FORMATS as integers."""
    r1 = w.rows if r1 is None else r1
    part = w.rows_of(r0, r1)
    n, data, fmt = r1 - r0, part.data, w.fmt
    if fmt == "int8":
        d = np.repeat(part.scales[:, :1], w.cols // 32, axis=1)
        return IntForm(32, ggml._signed8(data), np.ascontiguousarray(d, np.float32))
    if fmt == "int4-g64":
        lo, hi = _ints(data & np.uint8(15)), _ints(data >> np.uint8(4))
        q = np.stack([lo, hi], axis=-1).reshape(n, -1)[:, :w.cols] - 8
        return IntForm(32, q, np.repeat(part.scales, 2, axis=1)[:, :w.cols // 32].astype(np.float32))
    t = ggml.TYPES[fmt.upper()]
    blocks = data.reshape(-1, t.block_bytes)
    nb = w.cols // t.block_elems
    if fmt in K_TYPES:
        wi, d, dmin, mn = _k_quant(blocks, fmt)
        return IntForm(256, wi.reshape(n, w.cols), d.reshape(n, nb),
                       None if dmin is None else dmin.reshape(n, nb),
                       None if mn is None else mn.reshape(n, nb * 16), -1)
    wi, d, m = _block32(blocks, fmt)
    return IntForm(32, wi.reshape(n, w.cols), d.reshape(n, nb), None if m is None else m.reshape(n, nb), None, 1)
