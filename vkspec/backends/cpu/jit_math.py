"""The exact transcendentals and row reductions compiled by numba: the float32
operations of vkspec.exact, in its order, one element at a time.

Why: exact.py builds exp, recip and rsqrt from a dozen NumPy passes over
bit patterns. On a model as small as the trained hybrid each call costs
~50 us of fixed overhead whatever its size, so a decoding step spent most of
its time there (sigmoid, silu and RMSNorm are called per layer and, in the
MoE, per expert). The MTP head, which is one layer with seven RMSNorms,
paid that overhead in full.

Why it is still exact: the same rules as cpu_jit (no fast-math, so no
reassociation, no contraction into fused multiply-adds, denormals kept).
Where exact.py computes a value for every element and then picks one with
np.where, this computes only the value it picks. ``test_exact_core`` holds
every function here to exact.py bit for bit over edge values, denormals and
millions of random bit patterns, and checks the machine code for fused
multiply-adds.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ... import exact
from . import jit
from .jit_dot import dot

F, U = np.float32, np.uint32
_LO, _HI, _LOG2E = exact._EXP_LO, exact._EXP_HI, exact._LOG2E
_LN2_HI, _LN2_LO, _SQRTHF = exact._LN2_HI, exact._LN2_LO, exact._SQRTHF
_RCP_A, _RCP_B, _TWO24 = exact._RCP_A, exact._RCP_B, exact._TWO24
_SOFTPLUS_THRESHOLD = exact._SOFTPLUS_THRESHOLD
_EXP_P0, _EXP_P = exact._EXP_P[0], tuple(exact._EXP_P[1:])
_LOG_P0, _LOG_P = exact._LOG_P[0], tuple(exact._LOG_P[1:])
_ONE, _HALF, _ZERO = F(1.0), F(0.5), F(0.0)
_INF, _NAN = F(np.inf), F(np.nan)
_MAGIC = exact._RSQRT_MAGIC
_JIT = dict(inline="always", boundscheck=False, error_model="numpy")


@intrinsic
def _bits(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _from_bits(typingctx, b):
    if b != types.uint32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@njit(**_JIT)
def _pow2(e):
    return _from_bits(U((e + 127) << 23))


@njit(**_JIT)
def _scale(y, e):
    e1 = e >> 1
    return (y * _pow2(e1)) * _pow2(e - e1)


@njit(**_JIT)
def _unsubnormal(a):
    b = _bits(a)
    if (b & U(0x7F800000)) == U(0) and (b & U(0x007FFFFF)) != U(0):
        return a * _TWO24, 24
    return a, 0


@njit(**_JIT)
def exp1(x):
    if x != x:
        return x
    xc = min(max(x, _LO), _HI)
    n = F(np.floor(xc * _LOG2E + _HALF))
    r = xc - n * _LN2_HI
    r = r - n * _LN2_LO
    p = _EXP_P0
    for c in _EXP_P:
        p = p * r + c
    p = (p * (r * r) + r) + _ONE
    return _scale(p, np.int64(n))


@njit(**_JIT)
def log1(x):
    if x != x:
        return x
    b0 = _bits(x)
    if (b0 & U(0x7FFFFFFF)) == U(0):
        return -_INF
    if b0 == U(0x7F800000):
        return _INF
    if (b0 >> U(31)) == U(1):
        return _NAN
    xn, k = _unsubnormal(x)
    b = _bits(xn)
    e = np.int64(b >> U(23)) - 126 - k
    m = _from_bits(U((b & U(0x007FFFFF)) | U(0x3F000000)))
    if m < _SQRTHF:
        e = e - 1
        m = (m + m) - _ONE
    else:
        m = m - _ONE
    z = m * m
    y = _LOG_P0
    for c in _LOG_P:
        y = y * m + c
    y = (y * m) * z
    fe = F(e)
    y = y + fe * _LN2_LO
    y = y + z * F(-0.5)
    r = m + y
    return r + fe * _LN2_HI


@njit(**_JIT)
def recip1(a):
    if a != a:
        return a
    an, k = _unsubnormal(a)
    b = _bits(an)
    e = np.int64((b >> U(23)) & U(0xFF))
    if (b & U(0x7FFFFFFF)) == U(0):
        r = _INF
    elif e == 255:
        r = _ZERO
    else:
        m = _from_bits(U((b & U(0x007FFFFF)) | U(0x3F000000)))
        y = _RCP_A - _RCP_B * m
        for _ in range(3):
            y = y + y * (_ONE - m * y)
        r = _scale(y, 126 - e + k)
    return _from_bits(U(_bits(r) | (b & U(0x80000000))))


@njit(**_JIT)
def rsqrt1(a):
    if a != a:
        return a
    b0 = _bits(a)
    if (b0 & U(0x7FFFFFFF)) == U(0):
        return _INF
    if (b0 >> U(31)) == U(1):
        return _NAN
    if b0 == U(0x7F800000):
        return _ZERO
    an, k = _unsubnormal(a)
    b = _bits(an)
    y = _from_bits(U(_MAGIC - np.int64(b >> U(1))))
    for _ in range(3):
        t = (an * y) * y
        y = y + y * (_HALF - _HALF * t)
    return y * _pow2(k >> 1)


@njit(**_JIT)
def sigmoid1(x):
    return recip1(_ONE + exp1(-x))


@njit(**_JIT)
def silu1(x):
    return x * sigmoid1(x)


@njit(**_JIT)
def log1p1(u):
    w = _ONE + u
    if w == _ONE:
        return u
    return log1(w) * (u * recip1(w - _ONE))


@njit(**_JIT)
def softplus1(x):
    if x > _SOFTPLUS_THRESHOLD:
        return x
    mx = x if x >= _ZERO else _ZERO        # np.maximum: NaN and -0 stay x
    if x != x:
        mx = x
    return mx + log1p1(exp1(-abs(x)))


@njit(boundscheck=False, error_model="numpy", cache=True)
def _elementwise_kernel(x, out, op):
    """out = ELEMENTWISE[op](x) over flat arrays (op as in core_eval.comp)."""
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
        elif op == 4:
            out[i] = sigmoid1(v)
        elif op == 5:
            out[i] = silu1(v)
        elif op == 6:
            out[i] = softplus1(v)
        else:
            out[i] = log1p1(v)


def _elementwise(op: int, name: str):
    def f(x) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=F)
        out = np.empty_like(x)
        _elementwise_kernel(x.reshape(-1), out.reshape(-1), op)
        return out
    f.__name__ = name
    f.__doc__ = f"exact.{name}, compiled."
    return f


ELEMENTWISE = tuple(_elementwise(op, f.__name__) for op, f in enumerate(exact.ELEMENTWISE))
exp, log, recip, rsqrt, sigmoid, silu, softplus, log1p = ELEMENTWISE


# --- row reductions -------------------------------------------------------------

@njit(boundscheck=False, error_model="numpy", cache=True)
def _rms_rows(x, w, z, eps, inv_n, gated, out):
    """exact.rmsnorm per row of x (rows, K): (x * rsqrt(dot(x, x) * inv_n + eps)) * w,
    times silu(z) when gated."""
    k = x.shape[1]
    for r in range(x.shape[0]):
        rr = rsqrt1(dot(x[r], x[r]) * inv_n + eps)
        for j in range(k):
            v = (x[r, j] * rr) * w[j]
            out[r, j] = v * silu1(z[r, j]) if gated else v


@njit(boundscheck=False, error_model="numpy", cache=True)
def _softmax_rows(x, lens, out):
    """exact.softmax per row over its first lens[r] entries (the rest +0):
    exp(x - max) * recip(reduce_sum(e)), NaN-propagating max as np.max."""
    acc = np.empty(128, F)
    s = np.empty(32, F)
    for r in range(x.shape[0]):
        n = lens[r]
        m = x[r, 0]
        for j in range(1, n):
            v = x[r, j]
            if m != m:
                break
            if v > m or v != v:
                m = v
        for j in range(128):
            acc[j] = _ZERO
        for j in range(n):
            e = exp1(x[r, j] - m)
            out[r, j] = e
            acc[j % 128] = acc[j % 128] + e
        for j in range(n, x.shape[1]):
            out[r, j] = _ZERO
        q = recip1(jit._finish(acc, s, max(1, min(32, (n + 3) // 4))))
        for j in range(x.shape[1]):
            out[r, j] = out[r, j] * q


@njit(parallel=True, boundscheck=False, error_model="numpy", cache=True)
def _expert_mlps(gate, up, down, h, rows, experts, out):
    """out[p] = down[e] . (silu(gate[e] . h[r]) * (up[e] . h[r])) for the pair
    p = (rows[p], experts[p]): each dot in the canonical order, as gemv."""
    mi, width = gate.shape[1], down.shape[1]
    for p in prange(rows.shape[0]):
        r, e = rows[p], experts[p]
        a = np.empty(mi, F)
        for m in range(mi):
            a[m] = silu1(dot(gate[e, m], h[r])) * dot(up[e, m], h[r])
        for m in range(width):
            out[p, m] = dot(down[e, m], a)


def expert_mlps(gate, up, down, h, idx) -> np.ndarray:
    """cpu.expert_mlps over stacked f32 experts: (n, k, H)."""
    n, k = idx.shape
    assert gate.shape == up.shape and gate.shape[2] >= h.shape[1] and down.shape[2] >= gate.shape[1]
    out = np.empty((n * k, down.shape[1]), F)
    rows = np.repeat(np.arange(n, dtype=np.int64), k)
    _expert_mlps(gate, up, down, np.ascontiguousarray(h, dtype=F), rows,
                 np.ascontiguousarray(idx, dtype=np.int64).reshape(-1), out)
    return out.reshape(n, k, -1)


@njit(boundscheck=False, error_model="numpy", cache=True)
def _deltanet_scan(S, q, k, v, beta, decay, out, snaps):
    """cpu.deltanet_step for each row in turn, S kept after the first rows."""
    nv, dk, dv = S.shape
    acc = np.empty((128, dv), F)
    s = np.empty((32, dv), F)
    mem = np.empty(dv, F)
    delta = np.empty(dv, F)
    for i in range(q.shape[0]):
        for h in range(nv):
            sh = S[h]
            g = decay[i, h]
            for t in range(dk):
                for d in range(dv):
                    sh[t, d] = sh[t, d] * g
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


def deltanet_scan(S, q, k, v, beta, decay, keep: int):
    """cpu.deltanet_scan, compiled; S (contiguous float32) is updated in place."""
    assert S.dtype == F and S.flags.c_contiguous
    c = [np.ascontiguousarray(a, dtype=F) for a in (q, k, v, beta, decay)]
    out = np.empty(c[2].shape, F)
    snaps = np.empty((keep,) + S.shape, F)
    _deltanet_scan(S, *c, out, snaps)
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


def softmax(x, lens=None) -> np.ndarray:
    """exact.softmax over the last axis; with ``lens``, row r's valid prefix is
    lens[r] entries (exact.softmax's mask arange(L) < lens[r])."""
    x, x2 = _rows(x)
    n = np.full(x2.shape[0], x2.shape[1], np.int64) if lens is None else \
        np.ascontiguousarray(np.broadcast_to(np.asarray(lens, np.int64), x.shape[:-1]).reshape(-1))
    out = np.empty_like(x2)
    _softmax_rows(x2, n, out)
    return out.reshape(x.shape)


def machine_code() -> str:
    """The assembly of every compiled function here, compiled afresh for
    small arguments (numba cannot show cached code)."""
    x, w = np.ones((2, 9), F), np.ones(9, F)
    e3 = np.ones((2, 3, 9), F)
    calls = ((_elementwise_kernel, (w, np.empty(9, F), 0)),
             (_rms_rows, (x, w, x, F(1e-6), F(1 / 9), True, np.empty_like(x))),
             (_softmax_rows, (x, np.array([9, 4]), np.empty_like(x))),
             (_deltanet_scan, (np.ones((2, 3, 9), F), np.ones((1, 2, 3), F), np.ones((1, 2, 3), F),
                               np.ones((1, 2, 9), F), np.ones((1, 2), F), np.ones((1, 2), F),
                               np.empty((1, 2, 9), F), np.empty((1, 2, 3, 9), F))),
             (_expert_mlps, (e3, e3, np.ones((2, 9, 3), F), x, np.array([0, 1]), np.array([1, 0]),
                             np.empty((2, 9), F))))
    code = []
    for d, args in calls:
        fresh = njit(boundscheck=False, error_model="numpy")(d.py_func)
        fresh(*args)
        code += list(fresh.inspect_asm().values())
    return "\n".join(code)
