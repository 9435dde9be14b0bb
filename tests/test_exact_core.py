"""Every core function and GEMV: the device equals NumPy byte for byte."""

import os
import subprocess
import sys

import numpy as np
import pytest

from vkspec import exact
from vkspec.formats.matrix import dequantize, f32 as as_f32, from_array
from vkspec.formats.quant import quantize
from vkspec.backends.cpu import jit as cpu_jit, jit_math as cpu_jit_math, ops as cpu_ops
from vkspec.selftest import inputs, same_bits

from conftest import bits_equal


@pytest.mark.parametrize("op", range(len(exact.ELEMENTWISE)),
                         ids=[f.__name__ for f in exact.ELEMENTWISE])
@pytest.mark.parametrize("seed", [0, 1])
def test_elementwise(cpu, vk, op, seed):
    x = inputs(seed)
    bits_equal(cpu.core_eval(x, op), vk.core_eval(x, op))


def test_denormal_inputs_and_outputs(cpu, vk):
    rng = np.random.default_rng(3)
    den = (rng.integers(1, 1 << 23, 2000).astype(np.uint32)).view(np.float32)
    x = np.concatenate([den, -den, np.float32(-87.0) - rng.uniform(0, 17, 2000).astype(np.float32)])
    for op, f in enumerate(exact.ELEMENTWISE):
        bits_equal(cpu.core_eval(x, op), vk.core_eval(x, op))
    # exp really produces denormals, and the device keeps them
    e = vk.core_eval(np.array([-100.0], np.float32), 0)
    assert 0 < e[0] < np.float32(1.17549435e-38)


def test_inf_nan_policy(cpu):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)
    e, l, r, q = (cpu.core_eval(x, i) for i in range(4))
    assert e[0] == np.inf and e[1] == 0 and np.isnan(e[2]) and e[3] == 1 and e[4] == 1
    assert l[0] == np.inf and np.isnan(l[1]) and np.isnan(l[2]) and l[3] == -np.inf
    assert r[0] == 0 and r[1] == 0 and np.signbit(r[1]) and r[3] == np.inf and r[4] == -np.inf
    assert q[0] == 0 and np.isnan(q[1]) and q[3] == np.inf
    assert exact.argmax(np.array([np.nan, 1.0, 3.0, 3.0, np.nan], np.float32)) == 2
    assert exact.argmax(np.array([np.nan, np.nan], np.float32)) == 0


# columns are a multiple of 4 in every weight format (the loaders check it)
GEMV_SHAPES = [(1, 4), (7, 124), (33, 128), (64, 132), (130, 300), (257, 1000)]
HERE = ("f32", "int8", "int4-g64")      # the formats vkspec makes itself (tests/test_formats.py: all)


@pytest.mark.parametrize("fmt", HERE)
@pytest.mark.parametrize("shape", GEMV_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gemv_rows_1_to_8(cpu, vk, fmt, shape):
    rng = np.random.default_rng(shape[0] * 31 + shape[1])
    w = quantize(as_f32(rng.standard_normal(shape).astype(np.float32)), fmt)
    xs = (rng.standard_normal((8, shape[1])) * 10).astype(np.float32)
    alone = [cpu.gemv(w, xs[r]) for r in range(8)]
    for n in range(1, 9):
        got_cpu, got_vk = cpu.gemv(w, xs[:n]), vk.gemv(w, xs[:n])
        bits_equal(got_cpu, got_vk)
        for r in range(n):   # row r of a block has the bits of row r alone
            assert same_bits(got_vk[r], alone[r])


@pytest.mark.parametrize("fmt", HERE)
def test_gemv_edge_values(cpu, vk, fmt):
    rng = np.random.default_rng(9)
    w = rng.standard_normal((40, 256)).astype(np.float32)
    w[0] = 0.0
    w[1] *= np.float32(1e-38)                  # products in the denormal range
    w[2] *= np.float32(1e30)                   # large magnitudes
    w[3, :7] = [1e-45, -1e-45, 3e38, -3e38, 1e-40, 0.0, -0.0]
    xs = rng.standard_normal((4, 256)).astype(np.float32)
    xs[1] *= np.float32(1e-20)
    xs[2] = 0.0
    xs[3, :3] = [np.inf, np.nan, -np.inf]
    q = quantize(as_f32(w), fmt)
    bits_equal(cpu.gemv(q, xs), vk.gemv(q, xs))


def test_bf16_weights_stay_bf16(cpu, vk):
    """A bf16 weight (NaN, inf, -0 and denormals among its values) is kept as
    its 16-bit words on both backends: its values are the f32 matrix they
    widen to, and the GEMVs over the words equal the GEMV over those f32."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((70, 300)).astype(np.float32)
    w[1] *= np.float32(1e-38)
    w[2, :6] = [np.nan, np.inf, -np.inf, -0.0, 9.2e-41, -3e38]
    words = (w.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    b = from_array(words, "bf16")
    assert b.fmt == "bf16" and b.data.nbytes * 2 == w.nbytes
    widened = (words.astype(np.uint32) << np.uint32(16)).view(np.float32)
    bits_equal(dequantize(b), widened)
    bits_equal(dequantize(b, 3, 9), widened[3:9])
    xs = rng.standard_normal((5, 300)).astype(np.float32)
    want = cpu.gemv(as_f32(widened), xs)
    bits_equal(cpu.gemv(b, xs), want)
    bits_equal(vk.gemv(b, xs), want)


def test_gemv_matches_float64_closely(cpu):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 700)).astype(np.float32)
    x = rng.standard_normal(700).astype(np.float32)
    y = cpu.gemv(as_f32(w), x)
    ref = w.astype(np.float64) @ x.astype(np.float64)
    assert np.max(np.abs(y - ref)) < 1e-4


def test_quantized_values_are_q_times_scale():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 200)).astype(np.float32)
    for fmt, tol in (("int8", 1 / 127), ("int4-g64", 1 / 7)):
        d = dequantize(quantize(as_f32(w), fmt))
        assert np.max(np.abs(d - w)) <= tol * np.abs(w).max() * 0.51 + 1e-6


@pytest.mark.parametrize("n", [1, 5, 127, 128, 129, 1000, 2048])
def test_rmsnorm_softmax_argmax(cpu, vk, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((5, n)) * 4).astype(np.float32)
    x[4] = 0.0
    w = (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)
    bits_equal(cpu.rmsnorm(x, w, 1e-6), vk.rmsnorm(x, w, 1e-6))
    bits_equal(cpu.softmax(x), vk.softmax(x))
    bits_equal(cpu.argmax(x), vk.argmax(x))


def test_argmax_ties_and_nan(cpu, vk):
    x = np.array([[1, 3, 3, 2], [np.nan, 0, 0, np.nan], [-np.inf] * 4, [np.nan] * 4], np.float32)
    assert cpu.argmax(x).tolist() == [1, 1, 0, 0]
    bits_equal(cpu.argmax(x), vk.argmax(x))


def test_reduction_order_is_the_documented_one():
    """dot() sums 32 lanes of 4-wide accumulators, then (x+y)+(z+w), then a tree."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(300).astype(np.float32)
    w = rng.standard_normal(300).astype(np.float32)
    xp, wp = np.zeros(384, np.float32), np.zeros(384, np.float32)
    xp[:300], wp[:300] = x, w
    lanes = []
    for l in range(32):
        acc = [np.float32(0)] * 4
        for c in range(3):
            for j in range(4):
                i = c * 128 + 4 * l + j
                acc[j] = np.float32(acc[j] + np.float32(xp[i] * wp[i]))
        lanes.append(np.float32(np.float32(acc[0] + acc[1]) + np.float32(acc[2] + acc[3])))
    while len(lanes) > 1:
        h = len(lanes) // 2
        lanes = [np.float32(lanes[i] + lanes[i + h]) for i in range(h)]
    assert exact.dot(x, w).tobytes() == lanes[0].tobytes()


def _edge_block(rng, rows, cols):
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[0] = 0.0
    w[1] *= np.float32(1e-38)
    w[2] *= np.float32(1e30)
    w[3, :7] = [1e-45, -1e-45, 3e38, -3e38, 1e-40, 0.0, -0.0]
    xs = (rng.standard_normal((8, cols)) * 10).astype(np.float32)
    xs[1] *= np.float32(1e-20)
    xs[2] = 0.0
    xs[3, :3] = [np.inf, np.nan, -np.inf]
    w[4] = 0.0                                  # every product -0: the sum is +0
    xs[4] = -np.abs(xs[4]) - np.float32(1.0)
    return w, xs


@pytest.mark.parametrize("shape", GEMV_SHAPES + [(100, 576), (45, 1536), (9, 128)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_compiled_gemv_is_the_numpy_definition(shape):
    """cpu_jit.gemv returns exact.gemv's bits, for every block size and edge value."""
    rng = np.random.default_rng(shape[0] + 7 * shape[1])
    w, xs = _edge_block(rng, max(shape[0], 5), shape[1] if shape[1] >= 7 else 7)
    wp = np.ascontiguousarray(w)
    for n in range(1, 9):      # every split into cpu_jit_dot's 3-, 2- and 1-row kernels
        bits_equal(cpu_jit.gemv(wp, xs[:n]), exact.gemv(wp, xs[:n]))


@pytest.mark.parametrize("poison,nh,nkv", [(False, 9, 3), (True, 9, 3), (False, 20, 2)])
def test_attention_block_rows_equal_the_definition(poison, nh, nkv):
    """cpu.attend over a block of rows (the compiled path) gives each row the
    bits of attend_row, the NumPy definition, run alone, even when a later
    row's value is infinite (0 * inf would poison a shared pass); 10 query
    heads per KV head take the scores kernel past its 8 rows per key load."""
    rng = np.random.default_rng(11)
    L, n, hd = 150, 6, 64
    kc = rng.standard_normal((L, nkv, hd)).astype(np.float32)
    vc = rng.standard_normal((L, nkv, hd)).astype(np.float32)
    q = rng.standard_normal((n, nh, hd)).astype(np.float32)
    vc[:20] = -np.abs(vc[:20])                      # products of p = +0 with v < 0 are -0
    if poison:
        vc[L - 1, 0, 5] = np.inf
    lens = np.arange(L - n, L) + 1
    block = cpu_ops.attend(q, kc, vc, lens, np.float32(0.125))
    for i in range(n):
        alone = cpu_ops.attend_row(q[i], kc[:lens[i]], vc[:lens[i]], np.float32(0.125))
        bits_equal(block[i], alone)
    assert np.isfinite(block[0]).all()


@pytest.mark.parametrize("n,nh,nkv", [(1, 9, 3), (1, 8, 8), (2, 16, 1), (1, 40, 1), (8, 8, 2)])
def test_decode_and_verify_rows_of_small_heads_equal_the_definition(n, nh, nkv):
    """A head of 64 columns with few queries a KV head (decode and verify
    rows: up to jit_attend.KEYS_PATH_QUERIES) takes the sixteen-keys scores
    kernel, more take the queries-in-lanes one (40 a KV head, 16 over 2
    rows); either gives each row attend_row's bits, with a query whose
    products are all -0 (the definition's sum is +0) and an infinite key."""
    rng = np.random.default_rng(n * 100 + nh)
    L, hd = 200, 64
    kc = rng.standard_normal((L, nkv, hd)).astype(np.float32)
    vc = rng.standard_normal((L, nkv, hd)).astype(np.float32)
    q = rng.standard_normal((n, nh, hd)).astype(np.float32)
    kc[:, 0] = -np.abs(kc[:, 0])
    q[0, 0] = 0.0                                   # +0 * negative keys: -0 products everywhere
    kc[9, nkv - 1, 3] = np.inf
    lens = np.arange(L - n, L) + 1
    block = cpu_ops.attend(q, kc, vc, lens, np.float32(0.125))
    for i in range(n):
        bits_equal(block[i], cpu_ops.attend_row(q[i], kc[:lens[i]], vc[:lens[i]], np.float32(0.125)))


def _wide_isas():
    from vkspec.backends.cpu import qdot
    return list({qdot._variant(f): f for f in ("plain", "avx2", "avx512")}.values())


@pytest.mark.parametrize("n,nh,nkv,hd,window", [(1, 16, 8, 128, 0), (3, 8, 2, 256, 0), (2, 4, 2, 128, 40),
                                                  (1, 4, 2, 96, 0), (2, 4, 2, 192, 0)])
def test_wide_heads_attention_rows_equal_the_definition(n, nh, nkv, hd, window):
    """Heads wider than 64 columns score their keys in qdot's vk_scores once
    jit_qdot is bound (as every q8 layer's call binds it): each row's bits
    are attend_row's, with a window, a query whose products are all -0 and
    an infinite key. 96 and 192 columns also take row_values' narrower pass
    (after a wide one at 192 on AVX-512, and a partial one at 96)."""
    from vkspec.backends.cpu import jit_qdot
    jit_qdot.bind()
    rng = np.random.default_rng(hd + n)
    L = 150
    kc = rng.standard_normal((L, nkv, hd)).astype(np.float32)
    vc = rng.standard_normal((L, nkv, hd)).astype(np.float32)
    q = rng.standard_normal((n, nh, hd)).astype(np.float32)
    kc[:, 0] = -np.abs(kc[:, 0])
    q[0, 0] = 0.0
    kc[L - 30, nkv - 1, 5] = np.inf
    lens = np.arange(L - n, L) + 1
    block = cpu_ops.attend(q, kc, vc, lens, np.float32(0.088), window)
    for i in range(n):
        bits_equal(block[i], cpu_ops.attend_row(q[i], kc[:lens[i]], vc[:lens[i]], np.float32(0.088), window))


@pytest.mark.parametrize("isa", _wide_isas())
def test_wide_head_scores_are_exact_dot_times_scale(isa, monkeypatch):
    """qdot's vk_scores (attend_scores.h; heads wider than 64 columns) in
    every library this CPU runs: each score is exact.dot's bits times the
    scale, for heads of 128 and 256 (the whole-step instances) and 72 and 200
    (masked), 23 keys (a last block of 3), a query whose products are all -0
    (the definition's sum is +0), an infinite and a NaN key value."""
    import ctypes

    from vkspec.backends.cpu import qdot
    monkeypatch.setenv("VKSPEC_CPU_ISA", isa)
    lib = qdot.lib()
    rng = np.random.default_rng(5)
    nkv, keys, nq, scale = 2, 23, 3, np.float32(0.125)
    for d in (128, 256, 72, 200):
        kc = rng.standard_normal((keys, nkv, d)).astype(np.float32)
        kc[:, 1] = -np.abs(kc[:, 1])
        kc[4, 1, 7] = np.inf
        kc[9, 1, d - 1] = np.nan
        q = rng.standard_normal((nq, d)).astype(np.float32)
        q[0] = 0.0                                  # +0 * negative keys: -0 products
        out = np.full((nq, keys), 7.0, np.float32)
        k1 = kc[:, 1]                               # KV head 1: rows nkv * d apart
        lib.vk_scores(ctypes.c_void_p(k1.ctypes.data), nkv * d, ctypes.c_void_p(q.ctypes.data), d, nq,
                      ctypes.c_void_p(out.ctypes.data), keys, keys, d, scale)
        want = exact.dot(q[:, None, :], np.ascontiguousarray(k1)[None, :, :]) * scale
        bits_equal(out, want)
        assert not np.signbit(out[0, 10]) and out[0, 10] == 0


@pytest.mark.parametrize("hd", [64, 48, 4])
def test_lane_scores_are_exact_dot_times_scale_zero_signs_included(hd):
    """jit_attend._lane_scores (every row's queries of a KV head, one a
    vector lane, the +0 terms of exact.dot's order left out) gives each
    score exact.dot's bits times the scale: heads of 16, 12 and 1 lane
    groups, 18 queries a KV head (three vectors, the last partly empty),
    keys past two chunks, and a query whose products are all -0, where the
    definition's sum is +0 and the sum without its +0 terms is -0."""
    from vkspec.backends.cpu import jit_attend
    rng = np.random.default_rng(hd)
    n, nh, nkv, L = 6, 9, 3, 150
    kc = rng.standard_normal((L, nkv, hd)).astype(np.float32)
    q = rng.standard_normal((n * nh, hd)).astype(np.float32)
    kc[:, 1] = -np.abs(kc[:, 1])
    q[4] = 0.0                                      # row 0, head 4 (KV head 1): +0 * negative = -0 everywhere
    kc[7, 2, 0] = np.inf                            # key 7 of KV head 2: inf, or NaN where q is +0
    q[nh + 6, 0] = 0.0
    lo, hi, scale = 3, L, np.float32(0.125)
    scores = np.full((n, nh, hi), np.nan, np.float32)
    jit_attend._lane_scores(q, nh, np.ascontiguousarray(kc.transpose(1, 0, 2)), 0, lo, hi, scale, scores)
    heads = np.arange(nh) // (nh // nkv)
    want = exact.dot(q.reshape(n, nh, 1, 1, hd), kc[lo:hi].transpose(1, 0, 2)[heads][None, :, :, None, :])[..., 0] * scale
    bits_equal(scores[:, :, lo:], want.reshape(n, nh, hi - lo))
    assert np.signbit(scores[0, 4, lo:]).sum() == 0 and (scores[0, 4, lo:] == 0).all()


@pytest.mark.parametrize("window", [1, 20, 140])
def test_sliding_window_attention_rows_equal_the_definition(window):
    """cpu.attend with a window (the compiled path, which skips the 128-column
    blocks before the block's first window) gives each row attend_row's bits;
    keys before a row's window have probability +0 and their values are never
    read (inf there changes nothing); and the definition is the masked
    softmax attention over the keys at distance 0..window-1 (float64, 1e-6)."""
    rng = np.random.default_rng(window)
    L, n, nh, nkv, hd = 300, 7, 4, 2, 32
    kc = rng.standard_normal((L, nkv, hd)).astype(np.float32)
    vc = rng.standard_normal((L, nkv, hd)).astype(np.float32)
    q = rng.standard_normal((n, nh, hd)).astype(np.float32)
    lens = np.arange(L - n, L) + 1
    first = int(lens[0]) - window                  # the first key any row attends
    if first > 0:
        vc[first - 1] = np.inf
        kc[first - 1] = np.nan
    block = cpu_ops.attend(q, kc, vc, lens, np.float32(0.25), window)
    for i in range(n):
        alone = cpu_ops.attend_row(q[i], kc[:lens[i]], vc[:lens[i]], np.float32(0.25), window)
        bits_equal(block[i], alone)
        lo = max(0, int(lens[i]) - window)
        k64 = kc[lo:lens[i]].astype(np.float64)[:, np.arange(nh) // 2]        # (w, nh, hd)
        s = np.einsum("hd,whd->hw", q[i].astype(np.float64), k64) * 0.25
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        want = np.einsum("hw,whd->hd", p, vc[lo:lens[i]].astype(np.float64)[:, np.arange(nh) // 2])
        assert np.abs(block[i] - want).max() < 1e-6
    assert np.isfinite(block).all()


def _bit_patterns(n=1 << 20):
    """Edge values, denormals and uniformly random float32 bit patterns."""
    rng = np.random.default_rng(5)
    den = rng.integers(1, 1 << 23, 4000).astype(np.uint32).view(np.float32)
    wide = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    near = np.float32(-87.0) - rng.uniform(0, 17, 4000).astype(np.float32)
    edge = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 20.0, 20.000002, -104.0, 89.0, 1.0], np.float32)
    return np.concatenate([inputs(0), inputs(1), den, -den, near, -near, wide, edge])


@pytest.mark.parametrize("op", range(len(exact.ELEMENTWISE)), ids=[f.__name__ for f in exact.ELEMENTWISE])
def test_compiled_elementwise_is_the_numpy_definition(op):
    """cpu_jit_math's exp, log, recip, rsqrt, sigmoid, silu, softplus, log1p
    return exact's bits for every class of float32 input, and with times=u
    those bits multiplied by u (silu_mul's and gelu_mul's one call)."""
    x = _bit_patterns()
    u = np.random.default_rng(op).standard_normal(x.shape).astype(np.float32)
    with np.errstate(all="ignore"):
        want = exact.ELEMENTWISE[op](x)
        want_times = want * u
    got = cpu_jit_math.ELEMENTWISE[op](x)
    assert same_bits(got, want)
    assert same_bits(cpu_jit_math.ELEMENTWISE[op](x[:12].reshape(3, 4)), want[:12].reshape(3, 4))
    assert same_bits(cpu_jit_math.ELEMENTWISE[op](x, times=u), want_times)


@pytest.mark.parametrize("k", [1, 7, 48, 128, 192, 300, 576])
def test_compiled_row_reductions_are_the_numpy_definition(k):
    """RMSNorm (plain and gated), L2 norm and softmax (whole rows and valid
    prefixes) per row, as exact computes them."""
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((6, k)) * 3).astype(np.float32)
    x[1] *= np.float32(1e-22)                       # mean of squares underflows to denormals
    x[2] = 0.0
    x[3, :1] = np.float32(1e19)                     # the square overflows
    w = rng.standard_normal(k).astype(np.float32)
    z = (rng.standard_normal((6, k)) * 4).astype(np.float32)
    z[4, :6] = np.array([np.inf, -np.inf, np.nan, 100.0, -100.0, -0.0], np.float32)[:min(k, 6)]
    eps = 1e-6
    bits_equal(cpu_jit_math.rmsnorm(x, w, eps), exact.rmsnorm(x, w, eps))
    with np.errstate(all="ignore"):
        bits_equal(cpu_jit_math.rmsnorm(x, w, eps, z), exact.rmsnorm(x, w, eps) * exact.silu(z))
    bits_equal(cpu_jit_math.l2norm(x, eps), x * exact.rsqrt(exact.dot(x, x) + np.float32(eps))[..., None])
    x3 = x.reshape(2, 3, k)
    bits_equal(cpu_jit_math.rmsnorm(x3, w, eps), exact.rmsnorm(x3, w, eps))
    s = (rng.standard_normal((3, 2, k)) * 6).astype(np.float32)
    bits_equal(cpu_jit_math.softmax(s), exact.softmax(s))
    lens = np.array([1, max(1, k // 2)])
    valid = np.arange(k)[None, None, :] < lens[None, :, None]
    bits_equal(cpu_jit_math.softmax(s, lens), exact.softmax(s, valid))
    s[0, 0, k // 2] = np.nan
    s[1, 0, 0] = np.inf
    with np.errstate(all="ignore"):
        bits_equal(cpu_jit_math.softmax(s), exact.softmax(s))


@pytest.mark.parametrize("rd,hd", [(64, 64), (32, 64), (0, 16), (2, 2)])
def test_compiled_rope_is_the_numpy_definition(rd, hd, monkeypatch):
    """ops.rope's compiled path (jit_math.rope) against its NumPy lines, with
    infinities, NaN and signed zeros among the features, and the cache write."""
    rng = np.random.default_rng(rd + hd)
    x = (rng.standard_normal((3, 4, hd)) * 5).astype(np.float32)
    x.reshape(-1)[::7] = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 3e38], np.float32)[
        np.arange(len(x.reshape(-1)[::7])) % 6]
    cos, sin = (rng.standard_normal((3, rd)).astype(np.float32) for _ in range(2))
    pos = np.array([5, 1, 7])
    caches = []
    for enabled in (True, False):
        monkeypatch.setattr(cpu_jit, "ENABLED", enabled)
        cache = np.full((8, 4, hd), np.float32(-1.0))
        with np.errstate(all="ignore"):
            caches.append((cpu_ops.rope(x, cos, sin), cpu_ops.rope(x, cos, sin, cache=cache, pos=pos), cache))
    for got, want in zip(*caches):
        bits_equal(got, want)


def test_compiled_math_has_no_fused_multiply_add():
    from vkspec.backends.cpu import deltanet_calls, jit_route, jit_sublayer
    asm = (cpu_jit_math.machine_code() + jit_route.machine_code() + deltanet_calls.machine_code()
           + jit_sublayer.machine_code())
    assert "mulss" in asm or "mulps" in asm
    assert "vfmadd" not in asm and "vfmsub" not in asm and "vfnmadd" not in asm


@pytest.mark.parametrize("nv,dk,dv,n", [(1, 1, 1, 1), (4, 48, 48, 5), (2, 130, 7, 3), (2, 128, 128, 4),
                                        (3, 20, 5, 3)])
def test_compiled_delta_rule_scan_is_the_numpy_definition(nv, dk, dv, n, monkeypatch):
    """cpu.deltanet_scan compiled against the row-by-row NumPy definition:
    outputs, the state after every kept row, and the final state; both
    compiled kernels (dk <= 128 in steps of 4: two passes a row; else four),
    with -0 products (a zero key column, a zero state row) in the sums."""
    rng = np.random.default_rng(nv * dk + dv)
    S0 = rng.standard_normal((nv, dk, dv)).astype(np.float32)
    S0[:, -1] = 0
    q, k = (rng.standard_normal((2, n, nv, dk)) * 0.3).astype(np.float32)
    k[..., 0] = -0.0
    q[..., -1] = -q[..., -1]
    v = rng.standard_normal((n, nv, dv)).astype(np.float32)
    beta, decay = rng.uniform(0, 1, (2, n, nv)).astype(np.float32)
    decay[0, 0] = np.float32(1e-39)                 # a denormal decay
    runs = []
    for jit in ("1", "0"):
        monkeypatch.setattr(cpu_jit, "ENABLED", jit == "1")
        S = S0.copy()
        out, snaps = cpu_ops.deltanet_scan(S, q, k, v, beta, decay, n - 1)
        runs.append((out, snaps.copy(), S))
        # from a given start state (HostState.keep_before): S's own values never read
        S = np.full_like(S0, np.nan)
        out, snaps = cpu_ops.deltanet_scan(S, q, k, v, beta, decay, n - 1, src=S0.copy())
        runs.append((out, snaps.copy(), S))
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            bits_equal(a, b)


ISA_CHECK = """
import json, sys
import numpy as np
from vkspec import exact
from vkspec.backends.cpu import jit, jit_blocks, jit_dot
from vkspec.formats.samples import random_weight
rng = np.random.default_rng(0)
bad = []
for k in (4, 124, 128, 132, 576, 1000):
    w = rng.standard_normal((37, k)).astype(np.float32)
    x = rng.standard_normal((12, k)).astype(np.float32)
    for n in range(1, 13):
        if jit.gemv(w, x[:n]).tobytes() != exact.gemv(w, x[:n]).tobytes():
            bad.append(("f32", k, n))
for fmt, cols in [(f, 512 if f.endswith("_k") else 544)     # 17 blocks of 32: a partial last step of 4
                  for f in ("q4_k", "q6_k", "int8", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0")] + [("q4_0", 96)]:
    w = random_weight(fmt, 40, cols, rng)                  # 96: three groups, so a staged pass with none
    x = rng.standard_normal((9, cols)).astype(np.float32)
    from vkspec.formats.matrix import dequantize
    for n in range(1, 10):                           # the fused and staged kernels' 1..8 rows, and the buffer path
        if jit_blocks.gemv(w, x[:n]).tobytes() != exact.gemv(dequantize(w), x[:n]).tobytes():
            bad.append((fmt, cols, n))
sys.path.insert(0, sys.argv[1])
from test_formats import weights                     # edge blocks: subnormal, inf and NaN scales
from vkspec.selftest import same_bits                # (NaN payloads are outside the contract)
for fmt in ("q4_0", "q4_1", "q8_0", "q4_k"):
    w = weights(fmt, rng)[-1]
    x = rng.standard_normal((9, w.cols)).astype(np.float32)
    for n in range(1, 10):
        with np.errstate(all="ignore"):
            if not same_bits(jit_blocks.gemv(w, x[:n]), exact.gemv(dequantize(w), x[:n])):
                bad.append((fmt, "edge", n))
from vkspec.backends.cpu import ops
for hd, nh, nkv in ((64, 9, 3), (38, 4, 2), (80, 4, 2), (136, 2, 1)):   # 38, 80: partial vectors in every width;
    # 80: the GEMV-kernel scores; 136: row_values' widest pass, then its partial one
    kc, vc = (rng.standard_normal((150, nkv, hd)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((6, nh, hd)).astype(np.float32)
    lens = np.arange(145, 151)
    block = ops.attend(q, kc, vc, lens, np.float32(0.125))
    for i in range(6):
        if block[i].tobytes() != ops.attend_row(q[i], kc[:lens[i]], vc[:lens[i]], np.float32(0.125)).tobytes():
            bad.append(("attend", hd, i))
asm = jit_blocks.machine_code()
print(json.dumps({"isa": jit_dot.ISA, "bad": bad, "asm": asm}))
"""


ISAS = ("avx512", "avx2", "plain")


@pytest.fixture(scope="module")
def isa_checks(request, tmp_path_factory):
    """ISA_CHECK under each forced width that the session runs, all started
    at once: each is a numba compile of ~2 min on one core, and the three
    one after another were ~7 min of the suite on a 2-core machine."""
    wanted = {item.callspec.params["isa"] for item in request.session.items
              if item.originalname == "test_every_vector_width_gives_exact_gemv_bits_and_no_fma"}
    runs = {}
    for isa in (i for i in ISAS if i in wanted):
        d = tmp_path_factory.mktemp(f"isa-{isa}")
        env = dict(os.environ, VKSPEC_CPU_ISA=isa, NUMBA_CACHE_DIR=str(d / "numba"))
        out, err = open(d / "stdout", "w+"), open(d / "stderr", "w+")
        runs[isa] = (subprocess.Popen([sys.executable, "-c", ISA_CHECK, os.path.dirname(__file__)], env=env,
                                      stdout=out, stderr=err, text=True), out, err)
    yield runs
    for proc, out, err in runs.values():
        proc.kill()
        proc.wait()
        out.close()
        err.close()


@pytest.mark.slow
@pytest.mark.parametrize("isa", ISAS)
def test_every_vector_width_gives_exact_gemv_bits_and_no_fma(isa, isa_checks):
    """VKSPEC_CPU_ISA forces the dot kernels' vector width and lane passes
    (jit_ir.ISAS); each gives exact.gemv's bits for 1..12 rows and any width,
    the attention attend_row's, and its machine code (the attention's
    scores and values kernels included) has no fused multiply-add of any family. (The IR runs
    on any x86-64: a wider vector than the host has is split by LLVM; the host's own width is
    one of the three, so the kernels a run uses are among those read.)"""
    import json
    proc, out, err = isa_checks[isa]
    if proc.wait(timeout=900) != 0:
        err.seek(0)
        pytest.fail(err.read()[-3000:])
    out.seek(0)
    got = json.loads(out.read().strip().splitlines()[-1])
    assert got["isa"] == isa and got["bad"] == []
    asm = got["asm"]
    assert "mulps" in asm and all(f"vkspec_dot{r}:" in asm for r in range(1, 9))
    for kernel in ("vkspec_gemv1_q4_1", "vkspec_gemv8_q8_0",      # a fused GEMV, a staged one (AVX2, plain)
                   "vkspec_row_values", "vkspec_scores"):       # and attention's
        assert f"{kernel}:" in asm, kernel
    for family in ("vfmadd", "vfmsub", "vfnmadd", "vfnmsub"):
        assert family not in asm, family


def test_the_kernel_cache_is_named_after_the_dot_ir_and_the_sources():
    """numba keys a cached function on its own file only: kernels linked
    against another IR (another ISA, or a changed generator), or compiled
    from other Python (a kernel changed in one file, inlined into a cached
    caller in another), live in another folder and are never loaded."""
    from vkspec.backends.cpu import jit_ir, jit_ir_blocks, numba_cache  # noqa: F401  (sets the folder)
    digests = {isa: jit_ir_blocks.ir_digest(isa) for isa in jit_ir.ISAS}
    assert len(set(digests.values())) == len(digests)
    names = {p.name for p in numba_cache.compiled_sources()}
    assert {"jit_attend.py", "jit_sublayer.py", "jit_qdot.py", "expert_table.py", "exact.py"} <= names
    if "NUMBA_CACHE_DIR" not in os.environ or "/vkspec/numba/" in os.environ["NUMBA_CACHE_DIR"]:
        assert os.environ["NUMBA_CACHE_DIR"].endswith(numba_cache.folder())
        assert numba_cache.folder().endswith(f"{jit_ir.ISA}-{digests[jit_ir.ISA]}-{numba_cache.source_digest()}")


def test_a_changed_kernel_source_names_another_cache_folder(tmp_path, monkeypatch):
    """The sources' digest moves with any byte of them: a copy of the
    package's kernels with one line added to jit_attend.py digests apart."""
    from vkspec.backends.cpu import numba_cache
    files = numba_cache.compiled_sources()
    before = numba_cache.source_digest()
    copies = []
    for p in files:
        c = tmp_path / p.name
        c.write_bytes(p.read_bytes() + (b"# changed\n" if p.name == "jit_attend.py" else b""))
        copies.append(c)
    monkeypatch.setattr(numba_cache, "compiled_sources", lambda: copies)
    assert numba_cache.source_digest() != before


@pytest.mark.parametrize("n", [1, 5, 211])
def test_compiled_conv_step_is_the_numpy_definition(n, monkeypatch):
    """ops.conv_step's compiled taps (jit_math.conv_taps) against its NumPy
    lines: outputs and window, with infinities, NaN and signed zeros in the
    inputs and the ring."""
    rng = np.random.default_rng(n)
    ring = rng.standard_normal((3, 40)).astype(np.float32)
    x = (rng.standard_normal((n, 40)) * 3).astype(np.float32)
    x.reshape(-1)[::9] = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 3e38], np.float32)[
        np.arange(len(x.reshape(-1)[::9])) % 6]
    ring[0, :3] = [-0.0, np.nan, 1e-40]
    w = rng.standard_normal((40, 4)).astype(np.float32)
    w[0, 0] = -0.0
    runs = []
    with np.errstate(all="ignore"):
        for enabled in (True, False):
            monkeypatch.setattr(cpu_jit, "ENABLED", enabled)
            runs.append(cpu_ops.conv_step(ring, x, w))
    bits_equal(runs[0][0], runs[1][0])
    bits_equal(runs[0][1], runs[1][1])
