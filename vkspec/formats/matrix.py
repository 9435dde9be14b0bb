"""A weight matrix held the way its file stores it.

Every format keeps a row's values in ``row_bytes`` consecutive bytes, rows
after rows, so a matrix is a (rows, row_bytes) uint8 array: usually a view of
the memory-mapped file, never widened. A format defines what those bytes
stand for (``dequantize``): formats/ggml.py for GGUF's block types (F16, BF16,
Q4_0 ... Q6_K), quant.py for the formats vkspec quantises to while loading
(int8, int4-g64), and fp8 (e4m3 with a scale per 128 x 128 block, kept as a
scale per row and 128 columns). The compiled CPU kernels
(backends/cpu/jit_blocks.py) and the shaders (shaders/weights.glsl) compute
the same values, and the tests hold all three together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import ggml


@dataclass(frozen=True)
class Format:
    name: str
    block_elems: int          # columns per block (1: one value per element)
    block_bytes: int
    scales_per_block: int = 0 # scales kept outside the data: per row (int8) or per block
    scale_cols: int = 0       # columns one outside scale covers (0: the whole row)

    def row_bytes(self, cols: int) -> int:
        return -(-cols // self.block_elems) * self.block_bytes

    @property
    def variant(self) -> str:
        """The shader variant (and define) that reads this format."""
        return self.name.replace("-", "_")


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("f32", 1, 4), Format("f16", 1, 2), Format("bf16", 1, 2),
    Format("int8", 1, 1, scale_cols=0),
    Format("int4-g64", 64, 32, scale_cols=64),
    Format("fp8", 1, 1, scale_cols=128),
    *(Format(t.name.lower(), t.block_elems, t.block_bytes)
      for t in ggml.TYPES.values() if t.name not in ("F32", "F16", "BF16")),
)}
QUANTISED_HERE = ("int8", "int4-g64")        # what --dtype may ask for


@dataclass
class QWeight:
    """A weight matrix (rows, cols) in one of FORMATS: ``data`` (rows,
    row_bytes) uint8, rows contiguous; ``scales`` float32 (rows, groups) for the
    formats that keep scales outside the data, else empty.

    ``order``: where a file stores rows in another order than the forward pass
    reads them (llama.cpp's interleaved q/k rows, Qwen3-Next's per-head
    groups), logical row i is stored row order[i]. Nothing is moved on the
    host: the CPU permutes a GEMV's outputs (each row's bits do not depend on
    its neighbours), the device upload writes the rows in logical order.

    ``acts``: the arithmetic of a GEMV over this weight: "f32" (exact.gemv
    of the decoded values) or "q8" (int8 activation blocks and integer dots,
    exact.q8_dot; set by --activations q8 on the block formats)."""
    fmt: str
    rows: int
    cols: int
    data: np.ndarray
    scales: np.ndarray
    order: np.ndarray | None = None
    acts: str = "f32"

    def __post_init__(self):
        f = FORMATS[self.fmt]
        assert self.data.dtype == np.uint8 and self.data.shape == (self.rows, f.row_bytes(self.cols)), \
            (self.fmt, self.data.dtype, self.data.shape, self.rows, f.row_bytes(self.cols))

    @property
    def format(self) -> Format:
        return FORMATS[self.fmt]

    @property
    def row_bytes(self) -> int:
        return self.data.shape[1]

    @property
    def scales_per_row(self) -> int:
        return self.scales.shape[1] if self.scales.ndim == 2 else 0

    def nbytes(self) -> int:
        return int(self.data.nbytes + self.scales.nbytes)

    def stored(self, rows) -> np.ndarray:
        """The stored rows that hold logical rows ``rows`` (an array or slice)."""
        idx = np.arange(self.rows)[rows]
        return idx if self.order is None else self.order[idx]

    def rows_of(self, r0: int, r1: int) -> "QWeight":
        """Logical rows r0..r1-1: a view when they are stored in order."""
        if self.order is not None:
            return self.take(np.arange(r0, r1))
        return QWeight(self.fmt, r1 - r0, self.cols, self.data[r0:r1],
                       self.scales[r0:r1] if self.scales.size else self.scales, acts=self.acts)

    def take(self, ids) -> "QWeight":
        """Logical rows ``ids``, in that order, each with its own bytes (a copy:
        the lm_head rows of the MTP head's draft vocabulary)."""
        s = self.stored(np.asarray(ids, dtype=np.int64))
        return QWeight(self.fmt, int(s.size), self.cols, np.ascontiguousarray(self.data[s]),
                       np.ascontiguousarray(self.scales[s]) if self.scales.size else self.scales, acts=self.acts)

    def reordered(self, order) -> "QWeight":
        """The same bytes read in another row order (logical row i = current logical row order[i])."""
        return QWeight(self.fmt, self.rows, self.cols, self.data, self.scales,
                       self.stored(np.asarray(order, dtype=np.int64)), self.acts)


def no_scales() -> np.ndarray:
    return np.zeros((0, 0), np.float32)


def from_array(a: np.ndarray, fmt: str, scales: np.ndarray | None = None) -> QWeight:
    """A QWeight over an array whose rows already hold the format's bytes
    (f32 / f16 / bf16 as float32 / uint16, ggml blocks as uint8): a view."""
    rows = a.shape[0]
    data = np.ascontiguousarray(a).reshape(rows, -1).view(np.uint8)
    f = FORMATS[fmt]
    cols = data.shape[1] // f.block_bytes * f.block_elems
    return QWeight(fmt, rows, cols, data, no_scales() if scales is None else scales)


def f32(a: np.ndarray) -> QWeight:
    return from_array(np.asarray(a, np.float32), "f32")


def dequantize(w: QWeight, r0: int = 0, r1: int | None = None) -> np.ndarray:
    """Logical rows r0..r1-1 as float32 (rows, cols): the values every kernel computes with."""
    r1 = w.rows if r1 is None else r1
    if w.order is not None:
        w, r0, r1 = w.rows_of(r0, r1), 0, r1 - r0
    n, d = r1 - r0, w.data[r0:r1]
    if w.fmt == "f32":
        return d.view(np.float32)
    if w.fmt in ("f16", "bf16"):
        return ggml.TYPES[w.fmt.upper()].dequantize(d.reshape(-1, 2)).reshape(n, w.cols)
    if w.fmt == "int8":
        return d.view(np.int8).astype(np.float32) * w.scales[r0:r1, :1]
    if w.fmt == "int4-g64":
        lo, hi = (d & np.uint8(15)).astype(np.int32), (d >> np.uint8(4)).astype(np.int32)
        q = np.stack([lo, hi], axis=-1).reshape(n, -1, 64) - np.int32(8)
        return (q.astype(np.float32) * w.scales[r0:r1, :, None]).reshape(n, -1)[:, :w.cols]
    if w.fmt == "fp8":
        v = FP8_E4M3[d]
        return v * np.repeat(w.scales[r0:r1], 128, axis=1)[:, :w.cols]
    t = ggml.TYPES[w.fmt.upper()]
    return t.dequantize(d.reshape(-1, t.block_bytes)).reshape(n, w.cols)


def _fp8_e4m3_table() -> np.ndarray:
    b = np.arange(256, dtype=np.uint32)
    s = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = (b & 7).astype(np.float64)
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e.astype(np.float64) - 7))
    v = np.where((e == 15) & ((b & 7) == 7), np.nan, v)     # e4m3fn: only S.1111.111 is NaN
    return (s * v).astype(np.float32)


FP8_E4M3 = _fp8_e4m3_table()     # every e4m3 value is exact in float32
