"""The exact transcendentals and row reductions compiled by numba: the float32
operations of vkspec.exact, in its order, one element at a time.

Why: exact.py runs each formula as a dozen NumPy passes over whole arrays. On
a model as small as the trained hybrid each call's fixed overhead outweighs
its arithmetic, so a decoding step spent most of its time there
(sigmoid, silu and RMSNorm are called per layer and, in the MoE, per expert).

One source: the scalar functions here are exact.py's own formulas (``_exp``,
``_log``, ...) compiled by numba. exact.py writes them with three primitives
(``bits``, ``from_bits``, ``select``) that NumPy runs on arrays; this module
gives numba scalar versions of those (a bit cast, a branch) and registers
the formulas, so nothing is copied by hand.

Why it is still exact: no fast-math, so LLVM neither reassociates nor
contracts into fused multiply-adds, and denormals are kept.
``test_exact_core`` holds every function here to exact.py bit for bit over
edge values, denormals and millions of random bit patterns, and checks the
machine code for fused multiply-adds.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from . import numba_cache  # noqa: I001  (first: where numba caches)
from numba import njit, prange, types
from numba.extending import intrinsic, overload, register_jitable

from ... import exact
from . import jit
from .jit_dot import dot

F = np.float32
_ONE, _ZERO = exact.ONE, exact.ZERO
_GELU_C, _GELU_K = exact._GELU_C, exact._GELU_K
_JIT = dict(boundscheck=False, error_model="numpy")


@intrinsic
def _bitcast_f2u(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _bitcast_u2f(typingctx, b):
    if b != types.uint32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@intrinsic
def _select3(typingctx, c, a, b):
    """LLVM's select: both values computed, one taken (no branch)."""
    t = typingctx.unify_types(a, b)
    if c != types.boolean or t is None:
        return None

    def codegen(context, builder, sig, args):
        x = context.cast(builder, args[1], sig.args[1], t)
        y = context.cast(builder, args[2], sig.args[2], t)
        return builder.select(args[0], x, y)
    return t(c, a, b), codegen


@overload(exact.bits)
def _bits(x):
    if x == types.float32:
        return lambda x: _bitcast_f2u(x)


@overload(exact.from_bits)
def _from_bits(b):
    if isinstance(b, types.Integer):
        return lambda b: _bitcast_u2f(np.uint32(b))


@overload(exact.select)
def _select(c, a, b):
    return lambda c, a, b: _select3(c, a, b)


for _f in exact.FORMULAS:
    register_jitable(_f)

exp1, log1, recip1, rsqrt1 = (njit(**_JIT)(f) for f in (exact._exp, exact._log, exact._recip, exact._rsqrt))
silu1, softplus1, log1p1 = (njit(**_JIT)(f) for f in (exact._silu, exact._softplus, exact._log1p))


@njit(boundscheck=False, error_model="numpy", cache=True)
def _elementwise_kernel(x, out, op, times):
    """out = ELEMENTWISE[op](x) over flat arrays (op as in core_eval.comp),
    then out * times where times has x's size (the gated MLP's silu(g) * u,
    the same product as NumPy's after the call; empty: none).

    sigmoid, silu and gelu_tanh go in stages, each a loop of its own
    (exact._sigmoid's recip(1 + exp(-v)), then exact._silu's x * that, or
    exact._gelu_tanh's u first): as one loop LLVM did not inline exp and recip
    together and left it scalar."""
    if op == 4 or op == 5 or op == 8:
        for i in range(x.size):
            v = x[i]
            if op == 8:
                u = _GELU_C * (v + _GELU_K * ((v * v) * v))
                v = u + u
            out[i] = exp1(-v)
        for i in range(x.size):
            out[i] = recip1(_ONE + out[i])
        if op != 4:
            for i in range(x.size):
                out[i] = x[i] * out[i]
    else:
        for i in range(x.size):
            v = x[i]
            if op == 0:
                out[i] = exp1(v)
            elif op == 1:
                out[i] = log1(v)
            elif op == 2:
                out[i] = recip1(v)
            elif op == 3:
                out[i] = rsqrt1(v)
            elif op == 6:
                out[i] = softplus1(v)
            else:
                out[i] = log1p1(v)
    if times.size == x.size:
        for i in range(x.size):
            out[i] = out[i] * times[i]


_NO_TIMES = np.zeros(0, F)


def _elementwise(op: int, name: str):
    def f(x, times=None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=F)
        out = np.empty_like(x)
        t = _NO_TIMES if times is None else np.ascontiguousarray(times, dtype=F).reshape(-1)
        assert t.size in (0, x.size)
        _elementwise_kernel(x.reshape(-1), out.reshape(-1), op, t)
        return out
    f.__name__ = name
    f.__doc__ = f"exact.{name}, compiled (times: then multiplied by it, element by element)."
    return f


ELEMENTWISE = tuple(_elementwise(op, f.__name__) for op, f in enumerate(exact.ELEMENTWISE))
exp, log, recip, rsqrt, sigmoid, silu, softplus, log1p, gelu_tanh = ELEMENTWISE
ELEMENTWISE_OPS = {f.__name__: op for op, f in enumerate(ELEMENTWISE)}    # _elementwise_kernel's op of each


# --- row reductions -------------------------------------------------------------

@njit(boundscheck=False, error_model="numpy", cache=True)
def _rms_rows(x, w, z, eps, inv_n, gated, out):
    """exact.rmsnorm per row of x (rows, K): (x * rsqrt(dot(x, x) * inv_n + eps)) * w,
    times silu(z) when gated."""
    k = x.shape[1]
    e = np.empty(k if gated else 0, F)
    for r in range(x.shape[0]):
        rr = rsqrt1(dot(x[r], x[r]) * inv_n + eps)
        if gated:           # silu in _elementwise_kernel's stages: as one loop it stays scalar
            for j in range(k):
                e[j] = exp1(-z[r, j])
            for j in range(k):
                e[j] = recip1(_ONE + e[j])
            for j in range(k):
                out[r, j] = ((x[r, j] * rr) * w[j]) * (z[r, j] * e[j])
        else:
            for j in range(k):
                out[r, j] = (x[r, j] * rr) * w[j]


@njit(inline="always", boundscheck=False, error_model="numpy")
def softmax_row(x, lo, n, acc, s, out):
    """exact.softmax of x's entries lo..n-1 into out[lo:n] (x and out
    elsewhere neither read nor written): exp(x - max) * recip(reduce_sum(e)),
    NaN-propagating max as np.max, each entry in the lane of its own index
    (acc (128,) and s (32,) are scratch). Returns the factor recip(sum)."""
    m = x[lo]
    for j in range(lo + 1, n):
        v = x[j]
        if m != m:
            break
        if v > m or v != v:
            m = v
    for j in range(128):
        acc[j] = _ZERO
    for j in range(lo, n):              # apart from the lane sums, so that it vectorises
        out[j] = exp1(x[j] - m)
    for j in range(lo, n):
        acc[j % 128] = acc[j % 128] + out[j]
    q = recip1(jit._finish(acc, s, max(1, min(32, (n + 3) // 4))))
    for j in range(lo, n):
        out[j] = out[j] * q
    return q


@njit(boundscheck=False, error_model="numpy", cache=True)
def _softmax_rows(x, lens, starts, out):
    """exact.softmax per row over its entries starts[r]..lens[r]-1; the rest
    are +0 times the row's factor, as in exact.softmax's mask (NaN in a row
    of NaN)."""
    acc = np.empty(128, F)
    s = np.empty(32, F)
    for r in range(x.shape[0]):
        n, lo = lens[r], starts[r]
        q = softmax_row(x[r], lo, n, acc, s, out[r])
        for j in range(lo):
            out[r, j] = _ZERO * q
        for j in range(n, x.shape[1]):
            out[r, j] = _ZERO * q


@njit(boundscheck=False, error_model="numpy", cache=True)
def _deltanet_scan(S0, S, q, k, v, beta, decay, out, snaps):
    """cpu.deltanet_step for each row in turn, S kept after the first rows;
    the first row's decay reads S0 (S itself or the state to start from)."""
    nv, dk, dv = S.shape
    acc = np.empty((128, dv), F)
    s = np.empty((32, dv), F)
    mem = np.empty(dv, F)
    delta = np.empty(dv, F)
    for i in range(q.shape[0]):
        for h in range(nv):
            sh = S[h]
            s0 = S0[h] if i == 0 else sh
            g = decay[i, h]
            for t in range(dk):
                for d in range(dv):
                    sh[t, d] = s0[t, d] * g
            jit._columns(k[i, h], sh, acc, s, mem)
            for d in range(dv):
                delta[d] = (v[i, h, d] - mem[d]) * beta[i, h]
            for t in range(dk):
                kt = k[i, h, t]
                for d in range(dv):
                    sh[t, d] = sh[t, d] + kt * delta[d]
            jit._columns(q[i, h], sh, acc, s, out[i, h])
        if i < snaps.shape[0]:
            snaps[i] = S


@njit(inline="always", boundscheck=False, error_model="numpy")
def _lane_tree(s, dk, out):
    """fold_columns' tree over lane sums s (32, D), of which the first dk / 4
    are filled; the rest are +0 (no lane sum is -0: each product enters as
    +0 + p), so adding them is the identity, as in exact._finish."""
    for lane in range(dk // 4, 32):
        for d in range(s.shape[1]):
            s[lane, d] = _ZERO
    stride = 16
    while stride > 0:
        for j in range(stride):
            for d in range(s.shape[1]):
                s[j, d] = s[j, d] + s[j + stride, d]
        stride //= 2
    for d in range(s.shape[1]):
        out[d] = s[0, d]


@njit(parallel=True, boundscheck=False, error_model="numpy", cache=True)
def _deltanet_scan_fused(S0, S, q, k, v, beta, decay, out, snaps):
    """_deltanet_scan for dk <= 128, dk % 4 == 0, in two passes over each
    head's state instead of four: the decay with the k-columns, the update
    with the q-columns (and the kept copy). Each product is its own lane
    (dk <= 128), so a lane's value is +0 + product and the four lanes of a
    lane sum are added as they are produced: the same operations on the same
    values as _columns, without the (128, D) lane array. The first row's
    decay reads S0, as in _deltanet_scan.

    Heads outer, shared among the threads, rows inner: a head's recurrence
    is its own, so each head's rows run in order as before, and its state
    (dk x dv) stays in cache across a block's rows instead of every head's
    state streaming through once a row."""
    nv, dk, dv = S.shape
    for h in prange(nv):
        s = np.empty((32, dv), F)
        mem = np.empty(dv, F)
        delta = np.empty(dv, F)
        sh = S[h]
        for i in range(q.shape[0]):
            kh, qh = k[i, h], q[i, h]
            s0 = S0[h] if i == 0 else sh
            g = decay[i, h]
            for t in range(0, dk, 4):
                k0, k1, k2, k3 = kh[t], kh[t + 1], kh[t + 2], kh[t + 3]
                for d in range(dv):
                    a0 = s0[t, d] * g
                    a1 = s0[t + 1, d] * g
                    a2 = s0[t + 2, d] * g
                    a3 = s0[t + 3, d] * g
                    sh[t, d] = a0
                    sh[t + 1, d] = a1
                    sh[t + 2, d] = a2
                    sh[t + 3, d] = a3
                    s[t // 4, d] = ((_ZERO + k0 * a0) + (_ZERO + k1 * a1)) + ((_ZERO + k2 * a2) + (_ZERO + k3 * a3))
            _lane_tree(s, dk, mem)
            for d in range(dv):
                delta[d] = (v[i, h, d] - mem[d]) * beta[i, h]
            for t in range(0, dk, 4):
                k0, k1, k2, k3 = kh[t], kh[t + 1], kh[t + 2], kh[t + 3]
                q0, q1, q2, q3 = qh[t], qh[t + 1], qh[t + 2], qh[t + 3]
                for d in range(dv):
                    a0 = sh[t, d] + k0 * delta[d]
                    a1 = sh[t + 1, d] + k1 * delta[d]
                    a2 = sh[t + 2, d] + k2 * delta[d]
                    a3 = sh[t + 3, d] + k3 * delta[d]
                    sh[t, d] = a0
                    sh[t + 1, d] = a1
                    sh[t + 2, d] = a2
                    sh[t + 3, d] = a3
                    s[t // 4, d] = ((_ZERO + q0 * a0) + (_ZERO + q1 * a1)) + ((_ZERO + q2 * a2) + (_ZERO + q3 * a3))
                if i < snaps.shape[0]:
                    snaps[i, h, t:t + 4] = sh[t:t + 4]
            _lane_tree(s, dk, out[i, h])


def deltanet_scan(S, q, k, v, beta, decay, keep: int, room=None, src=None):
    """cpu.deltanet_scan, compiled; S (contiguous float32) is updated in place
    (from src when given)."""
    assert S.dtype == F and S.flags.c_contiguous
    S0 = S if src is None else src
    assert S0.dtype == F and S0.flags.c_contiguous and S0.shape == S.shape
    c = [np.ascontiguousarray(a, dtype=F) for a in (q, k, v, beta, decay)]
    out = np.empty(c[2].shape, F)
    snaps = np.empty((keep,) + S.shape, F) if room is None else room[:keep]
    dk = S.shape[1]
    (_deltanet_scan_fused if dk <= 128 and dk % 4 == 0 else _deltanet_scan)(S0, S, *c, out, snaps)
    return out, snaps


def _weight(w, k):
    """w as a contiguous float32 (k,) array, without a copy when it is one."""
    if isinstance(w, np.ndarray) and w.shape == (k,) and w.dtype == F and w.flags.c_contiguous:
        return w
    return np.ascontiguousarray(np.broadcast_to(np.asarray(w, F), (k,)))


def _rows(x):
    x = np.ascontiguousarray(x, dtype=F)
    return x, x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def rmsnorm(x, w, eps: float, z=None) -> np.ndarray:
    """exact.rmsnorm(x, w, eps), times exact.silu(z) when z is given."""
    x, x2 = _rows(x)
    k = x2.shape[1]
    wb = _weight(w, k)
    out = np.empty_like(x2)
    z2 = x2 if z is None else np.ascontiguousarray(z, dtype=F).reshape(x2.shape)
    _rms_rows(x2, wb, z2, F(eps), F(1.0 / k), z is not None, out)
    return out.reshape(x.shape)


def l2norm(x, eps: float) -> np.ndarray:
    """x * rsqrt(dot(x, x) + eps): an RMSNorm with 1/K = 1 and w = 1, both
    exact multiplications."""
    x, x2 = _rows(x)
    out = np.empty_like(x2)
    _rms_rows(x2, np.ones(x2.shape[1], F), x2, F(eps), _ONE, False, out)
    return out.reshape(x.shape)


def softmax(x, lens=None, starts=None) -> np.ndarray:
    """exact.softmax over the last axis; with ``lens`` (and ``starts``), row
    r's valid entries are starts[r]..lens[r]-1 (exact.softmax's mask
    starts[r] <= arange(L) < lens[r])."""
    x, x2 = _rows(x)

    def per_row(a, default):
        if a is None:
            return np.full(x2.shape[0], default, np.int64)
        return np.ascontiguousarray(np.broadcast_to(np.asarray(a, np.int64), x.shape[:-1]).reshape(-1))
    out = np.empty_like(x2)
    _softmax_rows(x2, per_row(lens, x2.shape[1]), per_row(starts, 0), out)
    return out.reshape(x.shape)


@njit(boundscheck=False, error_model="numpy", cache=True)
def _rope_rows(x, cos, sin, out):
    """ops.rope per (row, head): x * cos + rotate_half(x) * sin over the first
    rd features, the rest copied (operands in ops.rope's order)."""
    rd = cos.shape[1]
    half = rd // 2
    for r in range(x.shape[0]):
        for h in range(x.shape[1]):
            for j in range(half):
                out[r, h, j] = x[r, h, j] * cos[r, j] + (-x[r, h, j + half]) * sin[r, j]
            for j in range(half, rd):
                out[r, h, j] = x[r, h, j] * cos[r, j] + x[r, h, j - half] * sin[r, j]
            for j in range(rd, x.shape[2]):
                out[r, h, j] = x[r, h, j]


def rope(x, cos, sin) -> np.ndarray:
    """ops.rope without the cache: x (n, heads, hd), cos and sin (n, rd)."""
    x = np.ascontiguousarray(x, dtype=F)
    out = np.empty_like(x)
    _rope_rows(x, np.ascontiguousarray(cos, dtype=F), np.ascontiguousarray(sin, dtype=F), out)
    return out


@njit(boundscheck=False, error_model="numpy", cache=True)
def _conv_taps(window, wt, out):
    """ops.conv_step's sums: out[i] = +0 + wt[0] * window[i] + ... + wt[K-1] *
    window[i + K - 1], tap by tap, for each of out's rows (wt: the taps as
    rows, (K, C))."""
    for i in range(out.shape[0]):
        for c in range(out.shape[1]):
            out[i, c] = _ZERO
        for t in range(wt.shape[0]):
            for c in range(out.shape[1]):
                out[i, c] = out[i, c] + wt[t, c] * window[i + t, c]


def conv_taps(window, w) -> np.ndarray:
    """ops.conv_step's tap sums over window (K - 1 + n, C) with w (C, K), compiled."""
    n = window.shape[0] - w.shape[1] + 1
    out = np.empty((n, window.shape[1]), F)
    _conv_taps(np.ascontiguousarray(window, dtype=F), np.ascontiguousarray(np.asarray(w, F).T), out)
    return out


def machine_code() -> str:
    """The assembly of every compiled function here (numba_cache.machine_code)."""
    x, w = np.ones((2, 9), F), np.ones(9, F)
    calls = ((_elementwise_kernel, (w, np.empty(9, F), 5, w)),
             (_rms_rows, (x, w, x, F(1e-6), F(1 / 9), True, np.empty_like(x))),
             (_softmax_rows, (x, np.array([9, 4]), np.array([0, 1]), np.empty_like(x))),
             (_rope_rows, (np.ones((2, 3, 8), F), np.ones((2, 6), F), np.ones((2, 6), F), np.empty((2, 3, 8), F))),
             (_conv_taps, (np.ones((5, 9), F), np.ones((4, 9), F), np.empty((2, 9), F))),
             (_deltanet_scan, (np.ones((2, 3, 9), F), np.ones((2, 3, 9), F), np.ones((1, 2, 3), F), np.ones((1, 2, 3), F),
                               np.ones((1, 2, 9), F), np.ones((1, 2), F), np.ones((1, 2), F),
                               np.empty((1, 2, 9), F), np.empty((1, 2, 3, 9), F))),
             (_deltanet_scan_fused, (np.ones((2, 4, 9), F), np.ones((2, 4, 9), F), np.ones((1, 2, 4), F), np.ones((1, 2, 4), F),
                                     np.ones((1, 2, 9), F), np.ones((1, 2), F), np.ones((1, 2), F),
                                     np.empty((1, 2, 9), F), np.empty((1, 2, 4, 9), F))))
    return "\n".join(code for d, args in calls for code in numba_cache.machine_code(d, *args))
