"""The Vulkan backend's immediate ops: upload, one dispatch, download.

Used to test each shader against its NumPy twin. The model's recorded chain
(vkspec.chain) runs the same shaders without a round trip per op.
"""

from __future__ import annotations

import numpy as np

from ...formats.quant import QWeight
from ...shaders import push as P
from .device import get_device, load_shader


def _padded_rows(x: np.ndarray, cols_p: int) -> np.ndarray:
    out = np.zeros((x.shape[0], cols_p), dtype=np.float32)
    out[:, :x.shape[1]] = x
    return out


class VulkanOps:
    name = "vulkan"

    def __init__(self):
        self.dev = get_device()

    def _run(self, shader, inputs, outputs, groups, push):
        dev = self.dev
        ins = [dev.tensor(a) for a in inputs]
        outs = [dev.tensor(np.zeros(a.shape, a.dtype)) for a in outputs]
        algo = dev.algorithm(shader, ins + outs, groups, push)
        seq = dev.sequence()
        seq.record(dev.kp.OpTensorSyncDevice(ins + outs))
        seq.record(dev.kp.OpAlgoDispatch(algo))
        seq.record(dev.kp.OpTensorSyncLocal(outs))
        seq.eval()
        return [t.data().copy().reshape(a.shape) for t, a in zip(outs, outputs)]

    def gemv(self, w: QWeight, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        single = x.ndim == 1
        x2 = _padded_rows(x[None] if single else x, w.cols_p)
        n = x2.shape[0]
        if not 1 <= n <= 8:
            raise ValueError(f"gemv takes 1 to 8 rows, got {n}")
        scales = w.scales if w.scales.size else np.zeros(1, np.float32)
        push = P.Gemv(rows=w.rows, cols=w.cols_p, nvec=n, x_stride=w.cols_p, y_stride=w.rows)
        (y,) = self._run(load_shader("gemv", w.variant), [w.data, scales, x2],
                         [np.zeros((n, w.rows), np.float32)], -(-w.rows // 64), push)
        return y[0] if single else y

    def rmsnorm(self, x, w, eps: float) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, np.float32))
        rows, n = x.shape
        push = P.Rmsnorm(rows=rows, n=n, x_stride=n, y_stride=n, eps=eps, inv_n=np.float32(1.0 / n))
        (y,) = self._run(load_shader("rmsnorm", "plain"), [x, np.asarray(w, np.float32)],
                         [np.zeros_like(x)], -(-rows // 64), push)
        return y

    def softmax(self, x) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, np.float32))
        rows, n = x.shape
        push = P.Softmax(rows=rows, n=n, x_stride=n, y_stride=n)
        (y,) = self._run(load_shader("softmax"), [x], [np.zeros_like(x)], -(-rows // 64), push)
        return y

    def argmax(self, x) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, np.float32))
        rows, n = x.shape
        (y,) = self._run(load_shader("argmax"), [x], [np.zeros(rows, np.uint32)],
                         -(-rows // 64), P.Argmax(rows=rows, n=n, x_stride=n))
        return y

    def core_eval(self, x, op: int) -> np.ndarray:
        x = np.asarray(x, np.float32).ravel()
        (y,) = self._run(load_shader("core_eval"), [x], [np.zeros_like(x)],
                         -(-x.size // 64), P.CoreEval(n=x.size, op=op))
        return y
