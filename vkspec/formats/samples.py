"""Random weights of every format, for the selftest and the tests: realistic
values (f16 scales of a normal size), so that products stay finite, and every
quant of a block present."""

from __future__ import annotations

import numpy as np

from .matrix import FORMATS, QUANTISED_HERE, QWeight, f32, no_scales
from .quant import quantize

# byte offsets of each block type's f16 scales (d, and dmin / m where it has one)
F16_FIELDS = {"q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,),
              "q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}


def random_weight(fmt: str, rows: int, cols: int, rng: np.random.Generator) -> QWeight:
    values = rng.standard_normal((rows, cols)).astype(np.float32)
    if fmt == "f32":
        return f32(values)
    if fmt in QUANTISED_HERE:
        return quantize(f32(values), fmt)
    if fmt in ("f16", "bf16"):
        bits = values.astype(np.float16).view(np.uint16) if fmt == "f16" else \
            (values.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        return QWeight(fmt, rows, cols, bits.view(np.uint8).reshape(rows, -1), no_scales())
    if fmt == "fp8":
        data = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        data[(data & 0x7F) == 0x7F] = 1                       # no NaN codes
        scales = rng.uniform(0.5, 2.0, (rows, -(-cols // 128))).astype(np.float32)
        return QWeight(fmt, rows, cols, data, scales)
    f = FORMATS[fmt]
    blocks = rng.integers(0, 256, (rows, cols // f.block_elems, f.block_bytes), dtype=np.uint8)
    for at in F16_FIELDS[fmt]:
        scale = rng.uniform(0.001, 0.05, blocks.shape[:2]).astype(np.float16).view(np.uint8)
        blocks[:, :, at:at + 2] = scale.reshape(rows, -1, 2)
    return QWeight(fmt, rows, cols, blocks.reshape(rows, -1), no_scales())
