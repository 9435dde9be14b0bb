"""The Vulkan backend's immediate ops: upload, one dispatch, download.

Used to test each shader against its NumPy twin. The model's recorded chain
(recorder.py) runs the same shaders without a round trip per op.
"""

from __future__ import annotations

import numpy as np

from ... import exact
from ...formats.intform import block_size
from ...formats.matrix import QWeight
from ...shaders import push as P
from .device import get_device, load_shader, on_device
from .buffers import q8_words
from .memory import Uploader
from .recorder import gemv_dispatch, gemv_layout, gemv_spec, q8_dispatch


def _padded_rows(x: np.ndarray, cols_p: int) -> np.ndarray:
    out = np.zeros((x.shape[0], cols_p), dtype=np.float32)
    out[:, :x.shape[1]] = x
    return out


class VulkanOps:
    name = "vulkan"

    def __init__(self):
        self.dev = get_device()

    @on_device("in an op")
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

    @on_device("in a gemv")
    def gemv(self, w: QWeight, x: np.ndarray) -> np.ndarray:
        """The weight uploaded as it is stored (every part), 1 to 8 rows;
        a q8 weight's rows quantised on the device first (quantize_q8.comp)."""
        x = np.asarray(x, dtype=np.float32)
        single = x.ndim == 1
        cols_p = exact.padded(w.cols)
        x2 = _padded_rows(x[None] if single else x, cols_p)
        n = x2.shape[0]
        if not 1 <= n <= 8:
            raise ValueError(f"gemv takes 1 to 8 rows, got {n}")
        up = Uploader(self.dev)
        dw = up.weight("w", [w])
        dev = self.dev
        xt, yt = dev.tensor(x2), dev.tensor(np.zeros((n, w.rows), np.float32))
        seq, keep, lanes = dev.sequence(), [], gemv_layout(dev)
        for part in dw.parts:
            push = dict(rows=part.rows, cols=w.cols, nvec=n, y_stride=w.rows, y_off=part.first_row,
                        row_bytes=part.row_bytes, s_stride=part.s_stride)
            if part.acts == "q8":
                fb = block_size(part.fmt)
                qt = dev.tensor(np.zeros(n * q8_words(w.cols, fb), np.uint32))
                keep.append(dev.algorithm(load_shader("quantize_q8", f"b{fb}"), [xt, qt], (-(-w.cols // 256), n, 1),
                                          P.QuantizeQ8(rows=n, cols=w.cols, x_stride=cols_p,
                                                       q_stride=q8_words(w.cols, fb))))
                seq.record(dev.kp.OpAlgoDispatch(keep[-1]))
                variant, gx = q8_dispatch(part.variant, part.rows, lanes)
                keep.append(dev.algorithm(load_shader("gemv_q8", variant), [part.data, part.scales, qt, yt],
                                          gx, P.Gemv(x_stride=q8_words(w.cols, fb), **push), (n,)))
            else:
                variant, gx = gemv_dispatch(part.variant, part.rows, lanes)
                keep.append(dev.algorithm(load_shader("gemv", variant), [part.data, part.scales, xt, yt], gx,
                                          P.Gemv(x_stride=cols_p, **push), gemv_spec(lanes, n, part.variant)))
            seq.record(dev.kp.OpAlgoDispatch(keep[-1]))
        seq.record(dev.kp.OpTensorSyncLocal([yt]))
        seq.eval()
        y = yt.data().copy().reshape(n, w.rows)
        return y[0] if single else y

    def quantize_q8(self, x, block: int):
        """quantize_q8.comp on rows of x: (q int8, d, 16-column sums), as
        ops.quantize_q8 returns them."""
        x = np.atleast_2d(np.asarray(x, np.float32))
        rows, cols = x.shape
        words = q8_words(cols, block)
        (qw,) = self._run(load_shader("quantize_q8", f"b{block}"), [x], [np.zeros((rows, words), np.uint32)],
                          (-(-cols // 256), rows, 1), P.QuantizeQ8(rows=rows, cols=cols, x_stride=cols, q_stride=words))
        q = qw[:, :cols // 4].copy().view(np.int8).reshape(rows, cols)
        d = qw[:, cols // 4:cols // 4 + cols // block].copy().view(np.float32)
        sums = qw[:, cols // 4 + cols // block:cols // 4 + cols // block + cols // 16].copy().view(np.int32)
        return q, d, sums

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
