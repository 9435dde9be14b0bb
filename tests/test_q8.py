"""The q8 definition (exact.quantize_q8 / q8_dot over formats/intform.py)
and its compiled kernel (backends/cpu/qdot.py, csrc/qdot.c), byte for byte on
every instruction set this CPU has; the definition against float64 math."""

import numpy as np
import pytest

from conftest import bits_equal
from test_ggml_blocks import edge_blocks
from vkspec import exact
from vkspec.backends.cpu import qdot
from vkspec.backends.cpu.csrc import build
from vkspec.formats import ggml
from vkspec.formats.intform import K_TYPES, Q8_FORMATS, block_size, int_form
from vkspec.formats.matrix import QWeight, dequantize, no_scales
from vkspec.formats.samples import random_weight

# VKSPEC_CPU_ISA values reaching every library this CPU runs (avx512 takes AVX-VNNI where that is all)
ISAS = list({qdot._variant(f): f for f in ("plain", "avx2", "avx512")}.values())
COLS = 2336          # 73 blocks of 32: the kernels' 8-block groups and a tail of 1


def weights(fmt, rng):
    """A random weight and, for ggml's types, one made of edge blocks (every
    special in each f16 field, extreme packed scales): 9 superblocks a row
    for the K-quants (a group of 8 and a tail), 73 blocks for the others."""
    cols = 2304 if block_size(fmt) == 256 else COLS
    out = [random_weight(fmt, 24, cols, rng)]
    if fmt.upper() in ggml.TYPES:
        t = ggml.TYPES[fmt.upper()]
        blocks = edge_blocks(fmt.upper(), rng)
        per_row = cols // t.block_elems
        blocks = np.concatenate([blocks] * (-(-per_row // len(blocks)) + 1))
        n = blocks.shape[0] // per_row * per_row
        rows = blocks[:n].reshape(-1, per_row * t.block_bytes)
        out.append(QWeight(fmt, rows.shape[0], cols, np.ascontiguousarray(rows), no_scales()))
    return out


def q8_inputs(rng, n, cols):
    """Rows with ordinary values, then edge rows: zeros, +-max, subnormals,
    one inf, one NaN, a block of tiny values beside a normal one, exact halves."""
    x = rng.standard_normal((n, cols)).astype(np.float32) * np.float32(3.0)
    edge = [np.zeros(cols), np.full(cols, np.finfo(np.float32).max), np.full(cols, -np.finfo(np.float32).max),
            np.full(cols, 1e-40), rng.standard_normal(cols), rng.standard_normal(cols),
            np.r_[np.full(32, 1e-39), rng.standard_normal(cols - 32)], np.tile([127.0, 63.5, -0.5, 1.5], cols // 4)]
    edge[4][5] = np.inf
    edge[5][300 % cols] = np.nan
    return x, np.asarray(edge, np.float32)


def definition(w, x):
    fb = block_size(w.fmt)
    q, d = exact.quantize_q8(x, fb)
    return exact.q8_dot(int_form(w), q, d)


@pytest.mark.parametrize("fmt", Q8_FORMATS)
def test_integer_form_is_the_formats_values(fmt):
    """d * w + m and d * w - dmin * mn, in float64, round to dequantize's values."""
    w = random_weight(fmt, 6, 512, np.random.default_rng(3))
    f = int_form(w)
    nb = w.cols // f.fb
    v = np.repeat(f.d.astype(np.float64), f.fb, axis=1) * f.w
    if f.m is not None:
        mins = np.repeat(f.m.astype(np.float64), f.fb, axis=1)
        v = v + mins if f.mn is None else v - mins * np.repeat(f.mn, 16, axis=1)
    assert f.w.shape == (6, 512) and f.d.shape == (6, nb)
    assert np.array_equal(v.astype(np.float32), dequantize(w))     # a zero's sign aside: == not bits


def test_activation_quantisation_rules():
    rng = np.random.default_rng(4)
    x, edge = q8_inputs(rng, 4, 512)
    q, d = exact.quantize_q8(np.vstack([x, edge]), 32)
    assert np.abs(q.astype(np.int32)).max() <= 127
    err = np.abs(q[:4].astype(np.float64) * np.repeat(d[:4], 32, axis=1) - x)
    assert (err <= np.repeat(d[:4], 32, axis=1) * 0.5 * (1 + 1e-5)).all()       # nearest code
    assert (d[4] == 0).all() and (q[4] == 0).all()                               # zeros
    assert (q[5] == 127).all() and (q[6] == -127).all()                          # +-max
    assert (d[7] == 0).all()                                                     # subnormal: below a normal d
    assert np.isnan(d[8, 0]) and (q[8, :32] == 0).all() and np.isfinite(d[8, 1:]).all()   # inf
    assert np.isnan(d[9, 300 // 32]) and np.isfinite(np.delete(d[9], 300 // 32)).all()    # NaN
    assert d[10, 0] == 0 and d[10, 1] > 0
    assert q[11, 0] == 127 and q[11, 1] == 64 and q[11, 2] == 0 and q[11, 3] == 2      # half to even


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fb", [32, 256])
def test_compiled_quantisation_is_the_definition(isa, fb, monkeypatch):
    monkeypatch.setenv("VKSPEC_CPU_ISA", isa)
    x, edge = q8_inputs(np.random.default_rng(5), 6, 512)
    rows = np.vstack([x, edge])
    got = qdot.quantize(rows, fb)
    q, d = exact.quantize_q8(rows, fb)
    assert np.array_equal(got.q, q)
    bits_equal(got.d, d)
    assert np.array_equal(got.s16, exact.q8_sums(q)) and np.array_equal(got.s32, exact.q8_sums(q, 32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", Q8_FORMATS)
def test_compiled_q8_gemv_is_the_definition(fmt, isa, monkeypatch):
    """1 to 8 rows, random and edge weight blocks, edge activation rows;
    logical row order (a permuted weight) included."""
    monkeypatch.setenv("VKSPEC_CPU_ISA", isa)
    rng = np.random.default_rng(6)
    for w in weights(fmt, rng):
        x, edge = q8_inputs(rng, 8, w.cols)
        for n in range(1, 9):
            bits_equal(qdot.gemv(w, x[:n]), definition(w, x[:n]))
        bits_equal(qdot.gemv(w, edge), definition(w, edge))
        p = w.reordered(rng.permutation(w.rows))
        bits_equal(qdot.gemv(p, x[:3]), definition(p, x[:3]))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", K_TYPES)
def test_short_k_quant_rows(fmt, isa, monkeypatch):
    """Rows of fewer superblocks than a group of 8 (1; 2: Qwen3.6's expert down,
    512 columns; 3: Qwen3-MoE's, 768; 5), exactly 8, and 8 plus 7: the short
    group's missing lanes change no bit. Rows of fewer than 8 superblocks
    are taken several to a group (8 // superblocks, the last group of 21 rows
    short; a permuted weight row by row): each row's bits stay its own."""
    monkeypatch.setenv("VKSPEC_CPU_ISA", isa)
    rng = np.random.default_rng(8)
    for cols in (256, 512, 768, 1280, 2048, 3840):
        w = random_weight(fmt, 21, cols, rng)
        x, edge = q8_inputs(rng, 5, cols)
        for n in (1, 2, 5):
            bits_equal(qdot.gemv(w, x[:n]), definition(w, x[:n]))
        bits_equal(qdot.gemv(w, edge), definition(w, edge))
        p = w.reordered(rng.permutation(w.rows))
        bits_equal(qdot.gemv(p, x[:2]), definition(p, x[:2]))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", Q8_FORMATS)
def test_tiled_rows(fmt, isa, monkeypatch):
    """More activation rows than a tile: K-quant blocks of 32 weight rows
    against tiles of 8 activation rows, and gemm's groups of 8 weight rows
    against tiles of activation rows in its lanes (K-quants: AVX-512 16 from
    16 rows, AVX2 8 from 32 rows; 32-column blocks: AVX-512 16 from 16 rows,
    AVX2 8 from 32 rows);
    the last group and tile of each short (70 weight rows; 9, 16, 19 and 35
    activation rows, and 12, 22 and 43 with edge rows among them; 512, 2048
    and 2304 columns); a permuted weight too. Each output is its own row's
    dot, so tiling changes no bit."""
    monkeypatch.setenv("VKSPEC_CPU_ISA", isa)
    rng = np.random.default_rng(9)
    for cols in (512, 2048, 2304):
        w = random_weight(fmt, 70, cols, rng)
        x, edge = q8_inputs(rng, 35, cols)
        for n in (9, 16, 19, 35):
            bits_equal(qdot.gemv(w, x[:n]), definition(w, x[:n]))
        for rows in (np.vstack([edge, x[:4]]), np.vstack([x[:5], edge, x[5:14]]), np.vstack([x[:5], edge, x[5:]])):
            bits_equal(qdot.gemv(w, rows), definition(w, rows))
        p = w.reordered(rng.permutation(w.rows))
        bits_equal(qdot.gemv(p, x), definition(p, x))


@pytest.mark.parametrize("fmt", Q8_FORMATS)
def test_q8_gemv_is_close_to_float64(fmt):
    """The definition computes the product it claims: within the activations'
    quantisation error of the float64 GEMV of the same weights."""
    rng = np.random.default_rng(7)
    w = random_weight(fmt, 16, 1024, rng)
    x = rng.standard_normal((3, 1024)).astype(np.float32)
    want = x.astype(np.float64) @ dequantize(w).astype(np.float64).T
    got = definition(w, x)
    scale = np.abs(x).max() * np.abs(dequantize(w)).sum(axis=1).max() / 127
    assert np.abs(got - want).max() <= scale, (np.abs(got - want).max(), scale)


def test_a_rows_bits_do_not_depend_on_its_neighbours():
    w = random_weight("q4_k", 40, 1024, np.random.default_rng(8))
    x = np.random.default_rng(9).standard_normal((7, 1024)).astype(np.float32)
    together = qdot.gemv(w, x)
    for r in range(7):
        bits_equal(together[r], qdot.gemv(w, x[r:r + 1])[0])


def test_one_call_feeds_several_matrices_of_both_block_sizes():
    """Gemma 3's layers mix Q5_0/Q8_0 and Q4_K/Q6_K under one input: one call
    quantises it both ways and gives each matrix its own definition's bits."""
    rng = np.random.default_rng(10)
    ws = [random_weight(f, 40 + 8 * i, 2304, rng) for i, f in enumerate(("q5_0", "q4_k", "q8_0", "q6_k"))]
    x = rng.standard_normal((3, 2304)).astype(np.float32)
    for w, y in zip(ws, qdot.gemvs(ws, x)):
        bits_equal(y, definition(w, x))


def test_each_matrix_its_own_input_in_one_call():
    """qdot.gemvs_each (a MoE layer's expert downs): matrices of both block
    sizes and different widths, each against its own input of its own row
    count, in one call; each output is its definition's bits (a mix-up of
    inputs, widths or row counts between the matrices fails it)."""
    rng = np.random.default_rng(11)
    shapes = (("q4_k", 24, 768), ("q8_0", 40, 2048), ("q6_k", 16, 2048), ("q4_0", 8, 768))
    ws = [random_weight(f, rows, cols, rng) for f, rows, cols in shapes]
    xs = [rng.standard_normal((n, w.cols)).astype(np.float32) for n, w in zip((1, 3, 2, 5), ws)]
    for w, x, y in zip(ws, xs, qdot.gemvs_each(ws, xs)):
        bits_equal(y, definition(w, x))
    # one input for consecutive matrices (a row set's gates and ups) is quantised once for both
    # block sizes; the same array again after another, and the same rows in a new array, alike
    x, other = xs[1][:2].copy(), xs[2]
    ws2 = [random_weight("q4_k", 12, 2048, rng), ws[1], ws[2], ws[2], ws[1]]
    xs2 = [x[:1], x, x, other, x.copy()]            # x[:1]: x's address, not its rows
    for w, xi, y in zip(ws2, xs2, qdot.gemvs_each(ws2, xs2)):
        bits_equal(y, definition(w, xi))


@pytest.mark.parametrize("isa", ISAS)
def test_one_rows_experts_are_the_general_paths_and_the_definitions(isa, monkeypatch):
    """ops.expert_mlps of one row (a decode step: its k experts' gates and
    ups in one call, their activations in one, their downs in one; compiled,
    calling the library of each instruction set through jit_qdot's cell)
    gives the bits of the same experts routed among more rows and of the
    NumPy definition; experts in any order, of both block sizes (a swap of
    two experts' outputs fails it); a shared expert of their width in the
    same calls, a wider one on its own."""
    import dataclasses

    from vkspec.backends.cpu import jit_qdot
    monkeypatch.setenv("VKSPEC_CPU_ISA", isa)
    jit_qdot.bind()
    assert jit_qdot._BOUND[0] is qdot.lib()

    from vkspec.backends.cpu import jit, ops
    from vkspec.weights import MlpW, MoeW
    rng = np.random.default_rng(5)

    def q8(w):
        return dataclasses.replace(w, acts="q8")
    experts = [MlpW(q8(random_weight("q4_k", 256, 512, rng)), q8(random_weight("q4_0", 256, 512, rng)),
                    q8(random_weight("q6_k" if e % 2 else "q8_0", 512, 256, rng)))
               for e in range(6)]
    # a shared expert of the routed width joins their calls; one twice as wide runs on its own
    shared = [MlpW(q8(random_weight("q4_k", rows, 512, rng)), q8(random_weight("q5_0", rows, 512, rng)),
                   q8(random_weight("q6_k", 512, rows, rng))) for rows in (256, 512)]
    h = (rng.standard_normal((3, 512)) * 2).astype(np.float32)
    idx = np.array([[4, 1, 5, 0], [2, 4, 0, 3], [1, 5, 2, 4]])
    for sh in [None] + shared:
        w = MoeW(router=None, experts=experts, shared=sh, shared_gate=None)
        act = None if sh is None else "silu"
        one = ops.expert_mlps(w, h[1:2], idx[1:2], shared_act=act)
        among = ops.expert_mlps(w, h, idx, shared_act=act)    # the general path: rows grouped by expert
        with monkeypatch.context() as m:
            m.setattr(jit, "ENABLED", False)
            definition = ops.expert_mlps(w, h[1:2], idx[1:2], shared_act=act)
        if sh is None:
            bits_equal(one, among[1:2])
            bits_equal(one, definition)
        else:
            assert w.__dict__["_q8_tables_silu"].joined == (sh is shared[0])
            bits_equal(one[0], among[0][1:2])
            bits_equal(one[1], among[1][1:2])
            bits_equal(one[0], definition[0])
            bits_equal(one[1], definition[1])
