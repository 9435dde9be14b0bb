"""Weight formats: f32, int8 with a scale per row, int4 with a scale per 64 columns.

Quantisation is deterministic (float64 scales rounded once to float32, round
half to even). A quantised weight's value is defined as ``float32(q) * scale``,
one correctly rounded product, computed the same way by the CPU path
(:func:`dequantize`) and by the shaders (``load_w`` in gemv.comp).

Packed layouts (uint32 words, little-endian within a word), over columns padded
to a multiple of 128:
* q8: 4 signed bytes per word, column 4i+j in byte j; scales (rows,)
* q4: 8 nibbles per word, column 8i+j in nibble j, value nibble-8; scales (rows, cols/64)
* bf16 (device storage only, see :func:`as_bf16`): 2 halves per word, column
  2i in the low half; a half is the high 16 bits of the f32 value
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import exact

FORMATS = ("f32", "int8", "int4-g64")


@dataclass
class QWeight:
    """A weight matrix (rows, cols) in one of FORMATS, padded for the kernels."""
    fmt: str
    rows: int
    cols: int                 # logical columns
    data: np.ndarray          # f32 (rows, cols_p) or packed uint32 (rows, words)
    scales: np.ndarray        # float32; empty for f32

    @property
    def cols_p(self) -> int:
        return exact.padded(self.cols)

    @property
    def variant(self) -> str:
        return {"f32": "f32", "bf16": "bf16", "int8": "q8", "int4-g64": "q4"}[self.fmt]

    def nbytes(self) -> int:
        return int(self.data.nbytes + self.scales.nbytes)


def _pad_cols(w: np.ndarray) -> np.ndarray:
    cp = exact.padded(w.shape[1])
    if cp == w.shape[1]:
        return np.ascontiguousarray(w)
    out = np.zeros((w.shape[0], cp), dtype=w.dtype)
    out[:, :w.shape[1]] = w
    return out


def quantize(w: np.ndarray, fmt: str) -> QWeight:
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    if fmt == "f32":
        return QWeight(fmt, rows, cols, _pad_cols(w), np.zeros(0, np.float32))
    wp = _pad_cols(w).astype(np.float64)
    if fmt == "int8":
        amax = np.abs(wp).max(axis=1)
        scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(wp / scale[:, None].astype(np.float64)), -127, 127).astype(np.int8)
        return QWeight(fmt, rows, cols, q.view(np.uint32).reshape(rows, -1).copy(), scale)
    if fmt == "int4-g64":
        g = wp.reshape(rows, -1, 64)
        amax = np.abs(g).max(axis=2)
        scale = np.where(amax > 0, amax / 7.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(g / scale[:, :, None].astype(np.float64)), -8, 7).astype(np.int64) + 8
        q = q.reshape(rows, -1, 8).astype(np.uint32)
        packed = np.zeros(q.shape[:2], dtype=np.uint32)
        for j in range(8):
            packed |= q[:, :, j] << np.uint32(4 * j)
        return QWeight(fmt, rows, cols, packed, scale)
    raise ValueError(f"unknown weight format {fmt!r} (known: {', '.join(FORMATS)})")


def as_bf16(qw: QWeight) -> QWeight:
    """An f32 weight whose every value is a bfloat16 value (a bf16 checkpoint
    loaded at f32) as bf16 words: half the bytes on the device, and the same
    values (widening bf16 to f32 is exact), so the same bits. Anything else
    comes back as it is: this is a lossless form, never a rounding."""
    if qw.fmt != "f32":
        return qw
    u = np.ascontiguousarray(qw.data).view(np.uint32)
    if (u & np.uint32(0xFFFF)).any():
        return qw
    hi = (u >> np.uint32(16)).reshape(qw.rows, -1, 2)
    return QWeight("bf16", qw.rows, qw.cols, hi[:, :, 0] | (hi[:, :, 1] << np.uint32(16)), qw.scales)


def take_rows(qw: QWeight, ids) -> QWeight:
    """Rows ``ids`` of qw, in that order, each with its own bits (the lm_head
    rows of the MTP head's draft vocabulary)."""
    ids = np.asarray(ids, dtype=np.int64)
    scales = qw.scales[ids] if qw.scales.size else qw.scales
    return QWeight(qw.fmt, int(ids.size), qw.cols, np.ascontiguousarray(qw.data[ids]), np.ascontiguousarray(scales))


def dequantize(qw: QWeight, r0: int = 0, r1: int | None = None) -> np.ndarray:
    """Rows r0..r1 as float32 (rows, cols_p): the values the kernels compute with."""
    r1 = qw.rows if r1 is None else r1
    d = qw.data[r0:r1]
    if qw.fmt == "f32":
        return d
    if qw.fmt == "bf16":
        halves = np.stack([d << np.uint32(16), d & np.uint32(0xFFFF0000)], axis=-1)
        return halves.reshape(r1 - r0, -1).view(np.float32)
    if qw.fmt == "int8":
        q = d.view(np.int8).reshape(r1 - r0, -1).astype(np.float32)
        return q * qw.scales[r0:r1, None]
    shifts = (np.arange(8, dtype=np.uint32) * np.uint32(4))
    q = ((d[:, :, None] >> shifts) & np.uint32(15)).astype(np.int32) - 8
    q = q.reshape(r1 - r0, -1, 64).astype(np.float32)
    return (q * qw.scales[r0:r1, :, None]).reshape(r1 - r0, -1)
