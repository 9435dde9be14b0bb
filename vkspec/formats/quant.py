"""The formats vkspec quantises a checkpoint to while loading (``--dtype``),
one tensor at a time: the tensor is read in its own format, widened alone,
quantised, and dropped before the next one.

* int8: one signed byte per value and a float32 scale per row;
* int4-g64: an unsigned nibble per value (value - 8; column 2i in the low
  nibble of byte i) and a float32 scale per 64 columns, the last group padded.

Quantisation is deterministic (float64 scales rounded once to float32, round
half to even). A value is defined as ``float32(q) * scale``, one correctly
rounded product, computed the same way by formats.matrix.dequantize, the
compiled CPU kernels and the shaders.
"""

from __future__ import annotations

import numpy as np

from .matrix import QUANTISED_HERE, QWeight, dequantize


def quantize(w: QWeight, fmt: str) -> QWeight:
    """w in `fmt`: as it is for "f32" (the file's own format kept), else int8
    or int4-g64 computed from its values."""
    if fmt == "f32":
        return w
    if fmt not in QUANTISED_HERE:
        raise ValueError(f"unknown weight format {fmt!r} (known: f32, {', '.join(QUANTISED_HERE)})")
    v = dequantize(w).astype(np.float64)
    rows, cols = v.shape
    if fmt == "int8":
        amax = np.abs(v).max(axis=1) if cols else np.zeros(rows)
        scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(v / scale[:, None].astype(np.float64)), -127, 127).astype(np.int8)
        return QWeight(fmt, rows, cols, q.view(np.uint8), scale[:, None])
    groups = -(-cols // 64)
    g = np.zeros((rows, groups * 64))
    g[:, :cols] = v
    g = g.reshape(rows, groups, 64)
    amax = np.abs(g).max(axis=2)
    scale = np.where(amax > 0, amax / 7.0, 1.0).astype(np.float32)
    q = (np.clip(np.rint(g / scale[:, :, None].astype(np.float64)), -8, 7).astype(np.int64) + 8)
    q = q.reshape(rows, -1, 2).astype(np.uint8)
    return QWeight(fmt, rows, cols, q[:, :, 0] | (q[:, :, 1] << np.uint8(4)), scale)
