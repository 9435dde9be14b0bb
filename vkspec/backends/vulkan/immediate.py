"""The Vulkan backend's immediate ops: upload, one dispatch, download.

Used to test each shader against its NumPy twin (vkspec/selftest_ops.py).
An op runs here as the recorded chain (recorder.py) dispatches it: the op
table's bindings (graph.py), the same push struct, grid and specialization
constants, and the Step block (step.py) for the shaders that read one; only
alone, with a round trip of its buffers.
"""

from __future__ import annotations

import numpy as np

from ... import exact
from ...formats.intform import block_size
from ...formats.matrix import QWeight
from ...shaders import push as P
from . import graph as G
from .device import get_device, load_shader, on_device
from .buffers import q8_words
from .graph import Op, grid3, groups
from .memory import Uploader
from .recorder import gemv_dispatch, gemv_layout, gemv_spec, q8_dispatch
from .step import step_block

# the test shaders the chain never dispatches, so the op table has no entry for them
CORE_EVAL = Op("core_eval", ("x", "y"), P.CoreEval)
FLOAT_PROBE = Op("float_probe", ("c", "o"), type(None))

# where a weight starts in its buffers: a little way in, as an arena span puts
# a layer's (a shader that ignored w_off or s_off would read the filler)
W_OFF, S_OFF = 16, 3
FILLER = 0xA5


def _padded_rows(x: np.ndarray, cols_p: int) -> np.ndarray:
    out = np.zeros((x.shape[0], cols_p), dtype=np.float32)
    out[:, :x.shape[1]] = x
    return out


def weight_buffers(w: QWeight, w_off: int = 0, s_off: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """w's rows in logical order as uint32 words from byte w_off (a multiple
    of 4), and its outside scales from float s_off, filler before both."""
    data = np.ascontiguousarray(w.data[w.stored(slice(None))]).reshape(-1)
    words = np.full(-(-(w_off + data.size) // 4), FILLER * 0x01010101, np.uint32)
    words.view(np.uint8)[w_off:w_off + data.size] = data
    sc = w.scales[w.stored(slice(None))].reshape(-1) if w.scales_per_row else np.zeros(0, np.float32)
    scales = np.concatenate([np.full(s_off, -7.5, np.float32), sc.astype(np.float32)])
    return words, scales if scales.size else np.zeros(1, np.float32)


def q8_rows(q, d, sums) -> np.ndarray:
    """quantize_q8.comp's output rows (buffers.q8_words words each) holding
    (q, d, sums) as backends/cpu/ops.py quantize_q8 returns them."""
    rows, cols = q.shape
    nb = d.shape[1]
    out = np.zeros((rows, q8_words(cols, cols // nb)), np.uint32)
    out[:, :cols // 4] = np.ascontiguousarray(q, np.int8).view(np.uint32)
    out[:, cols // 4:cols // 4 + nb] = np.ascontiguousarray(d, np.float32).view(np.uint32)
    out[:, cols // 4 + nb:cols // 4 + nb + cols // 16] = np.ascontiguousarray(sums, np.int32).view(np.uint32)
    return out


class VulkanOps:
    name = "vulkan"

    def __init__(self):
        self.dev = get_device()

    @on_device("in an op")
    def dispatch(self, op: Op, variant: str | None, grid, push, spec=(), read=(), **buffers):
        """One dispatch of ``op`` (graph.Op), its buffers by binding name as
        arrays (uploaded) or tensors (step()); returns the arrays named in
        ``read`` as they are after it, in their shapes and dtypes."""
        dev = self.dev
        ts = {n: dev.tensor(b) if isinstance(b, np.ndarray) else b for n, b in buffers.items()}
        algo = dev.algorithm(load_shader(op.stem, variant), op.bound(ts), grid3(grid), push, spec)
        seq = dev.sequence()
        seq.record(dev.kp.OpTensorSyncDevice(list(ts.values())))
        seq.record(dev.kp.OpAlgoDispatch(algo))
        seq.record(dev.kp.OpTensorSyncLocal([ts[n] for n in read]))
        seq.eval()
        return [ts[n].data().copy().reshape(np.shape(buffers[n])) for n in read]

    def step(self, rows: int, tokens=None, pos=None, kv_len: int = 0, live: int = 0, slots=()):
        """A Step block (step.py) for `rows` rows, as the chain's host writes
        it before a replay."""
        t = self.dev.tensor(np.zeros(step_block().words, np.uint32))
        zeros = np.zeros(rows, np.uint32)
        step_block().write(t, kv_len, live, zeros if tokens is None else tokens, zeros if pos is None else pos,
                           slots)
        return t

    # --- gemv.comp and gemv_q8.comp -------------------------------------------------
    @on_device("in a gemv")
    def gemv(self, w: QWeight, x: np.ndarray) -> np.ndarray:
        """The weight uploaded as it is stored (every part), 1 to 8 rows, in
        this device's lane layout; a q8 weight's rows quantised on the device
        first (quantize_q8.comp)."""
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

    def _gemv(self, w: QWeight, x, lanes: str, kind: str, y, pairs: int, nvec: int, push: dict, **extra):
        """One dispatch of gemv.comp (float rows x) or gemv_q8.comp (q8_rows
        words x, for a weight with q8 activations) in the lane layout
        ``lanes``; kind "", "routed" or "rowmap" (recorder.ADDRESSING); y the output buffer as
        it is before (acc and the rows a dispatch leaves alone)."""
        fmt = w.format.variant
        if w.acts == "q8":
            op = {"": G.GEMV_Q8, "routed": G.GEMV_Q8_ROUTED, "rowmap": G.GEMV_Q8_ROWMAP}[kind]
            (variant, gx), spec, src = q8_dispatch(fmt, push["rows"], lanes, kind), (nvec,), dict(q=x)
        else:
            op = {"": G.GEMV, "routed": G.GEMV_ROUTED, "rowmap": G.GEMV_ROWMAP}[kind]
            x = _padded_rows(x, exact.padded(w.cols))
            (variant, gx), spec = gemv_dispatch(fmt, push["rows"], lanes, kind), gemv_spec(lanes, nvec, fmt)
            src = dict(x=x)
        data, scales = weight_buffers(w, W_OFF, S_OFF)
        push = P.Gemv(cols=w.cols, x_stride=x.shape[1], y_stride=y.shape[1], w_off=W_OFF, s_off=S_OFF,
                      row_bytes=w.row_bytes, s_stride=w.scales_per_row, **push)
        (out,) = self.dispatch(op, variant, (gx, pairs), push, spec=spec, read=("y",), w=data, scales=scales,
                               y=np.asarray(y, np.float32), **src, **extra)
        return out

    def gemv_rows(self, w: QWeight, x, lanes: str, y=None) -> np.ndarray:
        """y = w x for 1 to 8 rows of x, or with y given y + w x (acc: the
        residual stream)."""
        n = len(x)
        y0 = np.zeros((n, w.rows), np.float32) if y is None else y
        return self._gemv(w, x, lanes, "", y0, 1, n, dict(rows=w.rows, nvec=n, acc=int(y is not None)))

    def gemv_routed(self, slots: QWeight, per: int, x, lanes: str, idx, idx_off: int, slot_of, x_div: int, y):
        """Pair j (of idx[idx_off:]) into row j of y: expert idx[idx_off + j]'s
        rows (per of them, at slot slot_of[expert] of ``slots``) times row
        j // x_div of x; a pair whose expert has no slot is left alone."""
        pairs = len(idx) - idx_off
        push = dict(rows=per, nvec=pairs, w_expert=per * slots.row_bytes, s_expert=per * slots.scales_per_row,
                    x_div=x_div, idx_off=idx_off)
        return self._gemv(slots, x, lanes, "routed", y, pairs, 1, push, idx=np.asarray(idx, np.uint32),
                          slot_of=np.asarray(slot_of, np.uint32))

    def gemv_rowmap(self, part: QWeight, first_row: int, row_of, x, lanes: str, y):
        """Output row m = weight row row_of[m] for the rows that ``part`` (rows
        first_row.. of the matrix) holds; the other output rows left alone."""
        n = len(x)
        push = dict(rows=len(row_of), nvec=n, first_row=first_row, part_rows=part.rows)
        return self._gemv(part, x, lanes, "rowmap", y, 1, n, push, row_of=np.asarray(row_of, np.uint32))

    def quantize_q8(self, x, block: int):
        """quantize_q8.comp on rows of x: (q int8, d, 16-column sums), as
        ops.quantize_q8 returns them."""
        x = np.atleast_2d(np.asarray(x, np.float32))
        rows, cols = x.shape
        words = q8_words(cols, block)
        (qw,) = self.dispatch(G.QUANTIZE_Q8, f"b{block}", (groups(cols, 256), rows),
                              P.QuantizeQ8(rows=rows, cols=cols, x_stride=cols, q_stride=words), read=("q",),
                              x=x, q=np.zeros((rows, words), np.uint32))
        q = qw[:, :cols // 4].copy().view(np.int8).reshape(rows, cols)
        d = qw[:, cols // 4:cols // 4 + cols // block].copy().view(np.float32)
        sums = qw[:, cols // 4 + cols // block:cols // 4 + cols // block + cols // 16].copy().view(np.int32)
        return q, d, sums

    # --- row ops -----------------------------------------------------------------------
    def rmsnorm(self, x, w, eps: float) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, np.float32))
        rows, n = x.shape
        push = P.Rmsnorm(rows=rows, n=n, x_stride=n, y_stride=n, eps=eps, inv_n=np.float32(1.0 / n))
        (y,) = self.dispatch(G.RMSNORM, "plain", groups(rows), push, read=("y",),
                             x=x, w=np.asarray(w, np.float32), y=np.zeros_like(x))
        return y

    def softmax(self, x) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, np.float32))
        rows, n = x.shape
        push = P.Softmax(rows=rows, n=n, x_stride=n, y_stride=n)
        (y,) = self.dispatch(G.SOFTMAX, None, groups(rows), push, read=("y",), x=x, y=np.zeros_like(x))
        return y

    def argmax(self, x) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, np.float32))
        rows, n = x.shape
        (y,) = self.dispatch(G.ARGMAX, None, groups(rows), P.Argmax(rows=rows, n=n, x_stride=n), read=("y",),
                             x=x, y=np.zeros(rows, np.uint32))
        return y

    def core_eval(self, x, op: int) -> np.ndarray:
        x = np.asarray(x, np.float32).ravel()
        (y,) = self.dispatch(CORE_EVAL, None, groups(x.size), P.CoreEval(n=x.size, op=op), read=("y",),
                             x=x, y=np.zeros_like(x))
        return y

    def float_probe(self) -> np.ndarray:
        """float_probe.comp's result bits for every case of vkspec/ieee.py,
        as the start-up probe (probe.py) runs it."""
        from .probe import case_words
        words = case_words()
        (o,) = self.dispatch(FLOAT_PROBE, None, len(words), None, read=("o",),
                             c=words, o=np.zeros(len(words), np.uint32))
        return o
