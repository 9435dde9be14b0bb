"""The NumPy backend: each op is the executable definition of its shader."""

from __future__ import annotations

import numpy as np

from .. import exact
from ..quant import QWeight, dequantize


class CpuOps:
    name = "cpu"

    def gemv(self, w: QWeight, x: np.ndarray, rows_per_chunk: int = 512) -> np.ndarray:
        """x (n, cols) or (cols,) -> (n, rows): gemv.comp's twin."""
        x = np.asarray(x, dtype=np.float32)
        single = x.ndim == 1
        x2 = x[None] if single else x
        out = np.empty((x2.shape[0], w.rows), dtype=np.float32)
        for r0 in range(0, w.rows, rows_per_chunk):
            r1 = min(w.rows, r0 + rows_per_chunk)
            out[:, r0:r1] = exact.gemv(dequantize(w, r0, r1), x2)
        return out[0] if single else out

    def rmsnorm(self, x, w, eps: float) -> np.ndarray:
        return exact.rmsnorm(x, w, eps)

    def softmax(self, x) -> np.ndarray:
        return exact.softmax(x)

    def argmax(self, x) -> np.ndarray:
        return exact.argmax(x).astype(np.uint32)

    def core_eval(self, x, op: int) -> np.ndarray:
        return exact.ELEMENTWISE[op](x)
