"""Float weights (f32, f16, bf16) against float32 rows in the compiled
library (csrc/float_dot.h, vk_float_rows): exact.gemv's bits over the
dequantised values on every instruction set this CPU has, partial last steps
and edge values included; and the block GEMV (jit_blocks) calling it, with
the same bits as its own numba decoders where the library is not bound."""

import numpy as np
import pytest

from conftest import bits_equal
from test_q8 import ISAS
from vkspec import exact
from vkspec.backends.cpu import jit_blocks, jit_qdot, qdot
from vkspec.formats.matrix import QWeight, dequantize, no_scales

CODES = {"f32": 0, "f16": 1, "bf16": 2}
EDGES = np.array([0.0, -0.0, 6e-8, -3e-5, 65504.0, -1e30, 1e-40, np.inf, -np.inf, np.nan], np.float32)


def stored(fmt, values):
    """values (rows, cols) stored in fmt: f16 rounded, bf16 truncated."""
    if fmt == "f32":
        bits = values.view(np.uint8)
    elif fmt == "f16":
        with np.errstate(over="ignore"):                     # -1e30 becomes -inf
            bits = values.astype(np.float16).view(np.uint8)
    else:
        bits = (values.view(np.uint32) >> np.uint32(16)).astype(np.uint16).view(np.uint8)
    return QWeight(fmt, values.shape[0], values.shape[1], np.ascontiguousarray(bits.reshape(values.shape[0], -1)),
                   no_scales())


def weight(fmt, rows, cols, rng):
    v = rng.standard_normal((rows, cols)).astype(np.float32)
    v.flat[rng.integers(0, v.size, 3 * len(EDGES))] = np.tile(EDGES, 3)       # every special, a few places each
    return stored(fmt, v)


def inputs(rng, n, cols):
    """n rows of ordinary values, the last with subnormals in every seventh column and one infinity."""
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[-1, ::7] = np.float32(1e-39)
    x[-1, cols // 2] = np.inf
    return x


def library_rows(w, x):
    y = np.full((x.shape[0], w.rows), np.float32(7.0))
    qdot.lib().vk_float_rows(CODES[w.fmt], w.data.ctypes.data, w.data.shape[1], w.rows, x.ctypes.data, x.shape[0],
                             w.cols, y.ctypes.data, w.rows)
    return y


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", list(CODES))
def test_library_float_rows_are_the_definition(fmt, isa, monkeypatch):
    """Whole steps of 128 columns, partial ones (1, 100, 300, 2100); 1 to 9
    rows (past the 8-row tile, and an odd one beside pairs), then 16 and 23
    (float_gemm.h's tiles, the last one part full); 21 weight rows (a part
    tile), and 70 at one width (four passes of 16 weight rows and a part
    one)."""
    monkeypatch.setenv("VKSPEC_CPU_ISA", isa)
    rng = np.random.default_rng(11)
    for cols in (1, 100, 128, 300, 2048, 2100):
        w = weight(fmt, 70 if cols == 300 else 21, cols, rng)
        x = inputs(rng, 23, cols)
        for n in (1, 2, 3, 8, 9, 16, 23):
            bits_equal(library_rows(w, x[-n:]), exact.gemv(dequantize(w), x[-n:]))     # the edge row in each


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_block_gemv_takes_float_rows_from_the_library(fmt, monkeypatch):
    """jit_blocks' GEMV of an f16 or bf16 weight (q, k and v in one call, a
    permuted one too; 1 to 20 rows, so a prefill's tiles too) binds the
    library and equals the definition; with the cell's slot emptied, its
    numba decoders give the same bits."""
    rng = np.random.default_rng(12)
    ws = [weight(fmt, r, 300, rng) for r in (40, 24, 24)]
    ws.append(ws[0].reordered(rng.permutation(40)))
    x = inputs(rng, 20, 300)
    for n in (1, 2, 5, 20):
        got = jit_blocks.gemv_many(ws, x[:n], logical=True)
        assert jit_qdot._CELL[3], "the library's float_rows is not bound"
        for w, y in zip(ws, got):
            bits_equal(y, exact.gemv(dequantize(w), x[:n]))
    monkeypatch.setattr(jit_qdot, "bind", lambda: None)          # bind_float() leaves the cell as it is
    bound = jit_qdot._CELL[3]
    jit_qdot._CELL[3] = None
    try:
        for w, y in zip(ws, jit_blocks.gemv_many(ws, x[:3], logical=True)):
            bits_equal(y, exact.gemv(dequantize(w), x[:3]))
    finally:
        jit_qdot._CELL[3] = bound
