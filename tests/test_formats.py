"""Every weight format, three ways: the definition (formats.matrix.dequantize,
formats/ggml.py), the CPU's compiled decoders (jit_blocks) and the shaders
(weights.glsl). A GEMV over the stored blocks gives exact.gemv's bits over the
dequantized matrix, on the CPU and on the device, for 1 to 8 rows; edge blocks
(subnormal, infinite and NaN scales, extreme quants) included."""

import numpy as np
import pytest

from conftest import bits_equal
from test_ggml_blocks import edge_blocks
from vkspec import exact
from vkspec.backends.cpu import jit_blocks, ops
from vkspec.formats import ggml
from vkspec.formats.matrix import FORMATS, QWeight, dequantize, no_scales
from vkspec.formats.samples import random_weight

FMTS = list(FORMATS)


def weights(fmt, rng):
    """A random weight, and for block types one made of edge blocks too."""
    out = [random_weight(fmt, 24, 512, rng)]
    if fmt.upper() in ggml.TYPES and ggml.TYPES[fmt.upper()].block_elems > 1:
        t = ggml.TYPES[fmt.upper()]
        blocks = edge_blocks(fmt.upper(), rng)
        per_row = 512 // t.block_elems
        n = blocks.shape[0] // per_row * per_row               # every special in each field
        rows = blocks[:n].reshape(-1, per_row * t.block_bytes)
        out.append(QWeight(fmt, rows.shape[0], 512, np.ascontiguousarray(rows), no_scales()))
    return out


@pytest.mark.parametrize("fmt", FMTS)
def test_compiled_decoders_are_the_definition(fmt, monkeypatch):
    """Every stored row, and an embedding's rows picked by token (ops.embed,
    rows stored in another order too) against the definition's."""
    from vkspec.backends.cpu import jit
    rng = np.random.default_rng(1)
    for w in weights(fmt, rng):
        bits_equal(jit_blocks.decode(w), dequantize(w))
        ids = rng.integers(0, w.rows, 7)
        for table in (w, w.reordered(rng.permutation(w.rows))):
            got = ops.embed(table, ids, 2.5)
            with monkeypatch.context() as m:
                m.setattr(jit, "ENABLED", False)
                bits_equal(got, ops.embed(table, ids, 2.5))


@pytest.mark.parametrize("fmt", FMTS)
def test_gemv_over_blocks_is_exact_gemv_of_the_values_on_cpu_and_device(fmt, vk, monkeypatch):
    from vkspec.backends.cpu import jit
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    for w in weights(fmt, rng):
        values = dequantize(w)
        for n in range(1, 9):
            want = exact.gemv(values, x[:n])
            bits_equal(ops.gemv(w, x[:n]), want)                 # compiled
            bits_equal(vk.gemv(w, x[:n]), want)                  # device
        monkeypatch.setattr(jit, "ENABLED", False)
        bits_equal(ops.gemv(w, x[:3]), exact.gemv(values, x[:3]))     # the definition's own path
        monkeypatch.setattr(jit, "ENABLED", True)


def test_block_gemv_takes_every_row_block_once_whatever_the_threads():
    """The threads of a block GEMV compute a fixed share of its 16-row
    blocks each and take the rest from one shared count (jit_blocks._gemv),
    so which thread computes a block, and when, varies from call to call: with one
    thread, with two, and with fewer blocks than threads, one call over
    three matrices (1 + 3 + 7 blocks, the last one partial) gives every
    row exact.gemv's bits (a block nobody took would leave np.empty's
    garbage), for 1 row (fused kernel) and 5 rows (staged)."""
    import numba
    rng = np.random.default_rng(4)
    ws = [random_weight("q4_1", rows, 256, rng) for rows in (16, 40, 100)]
    x = rng.standard_normal((5, 256)).astype(np.float32)
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS), numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            for n in (1, 5):
                for _ in range(3):
                    got = ops.gemvs(ws, x[:n])
                    for w, g in zip(ws, got, strict=True):
                        bits_equal(g, exact.gemv(dequantize(w), x[:n]))
                bits_equal(ops.gemv(ws[0], x[:n]), exact.gemv(dequantize(ws[0]), x[:n]))   # one block, all threads
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("fmt", ["q4_k", "q4_1", "f32"])
def test_reordered_rows_permute_outputs_not_bytes(vk, fmt):
    """A matrix read in another row order (QWeight.order): the CPU's kernel
    writes each stored row's outputs to its logical column, the device
    uploads the rows in that order; no host copy. 80 rows: three of the
    kernel's row blocks; 1, 2 and 9 input rows: the fused and the buffered
    paths; beside an unordered matrix in one call (ops.gemvs)."""
    rng = np.random.default_rng(3)
    w = random_weight(fmt, 80, 256, rng)
    order = rng.permutation(80)
    r = w.reordered(order)
    assert r.data is w.data
    x = rng.standard_normal((9, 256)).astype(np.float32)
    for n in (1, 2, 9):
        want = exact.gemv(dequantize(w)[order], x[:n])
        bits_equal(ops.gemv(r, x[:n]), want)
        got_r, got_w = ops.gemvs([r, w], x[:n])
        bits_equal(got_r, want)
        bits_equal(got_w, exact.gemv(dequantize(w), x[:n]))
    bits_equal(vk.gemv(r, x[:3]), exact.gemv(dequantize(w)[order], x[:3]))


@pytest.mark.parametrize("count", [2, 4])
def test_gemvs_norm_and_act_gemv_are_the_composed_definitions(count):
    """ops.gemvs(ws, x, norm) is exact.gemv of exact.rmsnorm(x) for every
    matrix, whether the norm runs in the compiled call (up to three
    matrices) or once before two calls (four: Qwen3.5's qkv, z, b and a);
    ops.act_gemv is exact.gemv of the activation times u, silu and GELU."""
    rng = np.random.default_rng(count)
    ws = [random_weight(fmt, 40 + 8 * i, 256, rng) for i, fmt in enumerate(["q4_1", "q8_0", "q4_k", "q4_0"][:count])]
    x = rng.standard_normal((5, 256)).astype(np.float32) * 3
    nw = rng.standard_normal(256).astype(np.float32)
    for n in (1, 5):
        h = exact.rmsnorm(x[:n], nw, 1e-6)
        for w, got in zip(ws, ops.gemvs(ws, x[:n], (nw, 1e-6)), strict=True):
            bits_equal(got, exact.gemv(dequantize(w), h))
        g, u = x[:n], x[::-1][:n].copy()
        bits_equal(ops.act_gemv(ws[0], "silu", g, u), exact.gemv(dequantize(ws[0]), exact.silu(g) * u))
        bits_equal(ops.act_gemv(ws[0], "gelu_tanh", g, u), exact.gemv(dequantize(ws[0]), exact.gelu_tanh(g) * u))


def test_the_gemv_keeps_only_a_weights_own_arrays():
    """The CPU GEMV keeps each list's kernel arguments on its first matrix,
    but never an array it had to convert: scales held as float64 are read
    as a float32 copy each call, and nothing holds that copy after it."""
    rng = np.random.default_rng(5)
    w = random_weight("int8", 40, 128, rng)
    x = rng.standard_normal((2, 128)).astype(np.float32)
    want = ops.gemv(w, x)
    assert w.__dict__["_calls"]                          # its own arrays: kept
    wide = QWeight(w.fmt, w.rows, w.cols, w.data, w.scales.astype(np.float64))
    bits_equal(ops.gemv(wide, x), want)
    assert not wide.__dict__["_calls"]                   # a float32 copy of its scales: not kept


def test_a_weight_larger_than_one_buffer_is_split_in_parts(vk, monkeypatch):
    """VKSPEC_MAX_BUFFER_MB below the weight's size: the rows go to several
    device buffers, one GEMV each, and the bits do not change."""
    rng = np.random.default_rng(4)
    w = random_weight("q8_0", 300, 512, rng)           # 300 x 544 bytes
    x = rng.standard_normal((2, 512)).astype(np.float32)
    monkeypatch.setenv("VKSPEC_MAX_BUFFER_MB", str(64 * 544 / 2 ** 20))
    from vkspec.backends.vulkan.memory import Uploader
    assert len(Uploader.dry().weight("w", [w]).parts) == 5
    bits_equal(vk.gemv(w, x), exact.gemv(dequantize(w), x))
