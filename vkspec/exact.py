"""The exact arithmetic core, NumPy side: the executable definition.

Every function here has a twin of the same name in ``shaders/exact.glsl`` that
performs the same float32 operations in the same order. Vulkan guarantees
correct rounding only for ``+ - *``, so these functions use nothing else on
floats, plus exact bit manipulation and ``floor``:

* transcendentals are range reduction + a polynomial (Cephes-style minimax
  coefficients) evaluated in Horner order;
* reciprocal and rsqrt are three Newton steps from an exact seed;
* every reduction has one order, ``REDUCE_LANES`` lanes of 4-wide accumulators
  (see :func:`dot`), never ``np.sum``/``np.dot``/BLAS.

One source for the CPU: each elementwise function is a **formula** (``_exp``,
``_log``, ...) written with the primitives below, so that it runs on NumPy
arrays here and compiles for scalars in vkspec/backends/cpu/jit_math.py, which
gives numba its own versions of the primitives (``bits``, ``select`` ...) and
compiles these very functions. The GLSL twin is held to them by the tests.

Denormal policy: IEEE 754 gradual underflow everywhere. NumPy preserves
denormals, and so does Lavapipe (measured); the start-up probes
(backends/vulkan/probe.py, backends/cpu/fpenv.py: the cases of ieee.py)
refuse a device, or a CPU thread, that flushes, because plain ``+ - *`` in
the kernels would then differ. The functions here take denormal
inputs (they rescale them by 2**24 before reading exponent bits) and return
correctly rounded denormal results where the true value is one.

NaN never wins an argmax; exp/log/sigmoid/recip/rsqrt propagate NaN.
"""

from __future__ import annotations

import numpy as np

f32 = np.float32
u32 = np.uint32
i32 = np.int32

REDUCE_LANES = 32          # lanes of a reduction (the workgroup width)
REDUCE_VEC = 4             # columns per lane per step
REDUCE_STRIDE = REDUCE_LANES * REDUCE_VEC  # columns consumed per step

ZERO, HALF, ONE = f32(0.0), f32(0.5), f32(1.0)
INF, NAN = f32(np.inf), f32(np.nan)
_EXP_LO, _EXP_HI = f32(-104.0), f32(89.0)
_LOG2E = f32(1.44269504088896341)
_LN2_HI, _LN2_LO = f32(0.693359375), f32(-2.12194440e-4)
_EXP_P0, _EXP_PS = f32(1.9875691500e-4), tuple(f32(c) for c in (
    1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
_LOG_P0, _LOG_PS = f32(7.0376836292e-2), tuple(f32(c) for c in (
    -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
    2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1))
_SQRTHF = f32(0.707106781186547524)
_RCP_A, _RCP_B = f32(48.0 / 17.0), f32(32.0 / 17.0)
_RSQRT_MAGIC = u32(0x5F3759DF)
_SOFTPLUS_THRESHOLD = f32(20.0)
_GELU_C, _GELU_K = f32(np.sqrt(2.0 / np.pi)), f32(0.044715)      # GELU-tanh: sqrt(2/pi), the cubic term
_TWO24 = f32(16777216.0)


# --- primitives (jit_math gives numba a scalar version of each) ---------------------

def bits(x):
    """The IEEE 754 bits of float32 x."""
    return np.asarray(x, f32).view(u32)


def from_bits(b):
    return np.asarray(b, u32).view(f32)


def select(c, a, b):
    """a where c, else b (both computed)."""
    return np.where(c, a, b)


# --- formulas: arrays here, scalars once compiled ----------------------------------

def is_nan(b):
    return (b & u32(0x7FFFFFFF)) > u32(0x7F800000)


def is_zero(b):
    return (b & u32(0x7FFFFFFF)) == u32(0)


def _pow2(e):
    """2**e for integer e in [-126, 127], built from its exponent bits."""
    return from_bits(u32(u32(i32(e) + i32(127)) << u32(23)))


def _scale(y, e):
    """y * 2**e for e in [-252, 254]: one exact step, then one rounding."""
    e1 = e >> 1
    return (y * _pow2(e1)) * _pow2(e - e1)


def _unsubnormal(a):
    """(a * 2**24, 24) for a denormal a, else (a, 0): exact either way."""
    b = bits(a)
    sub = ((b & u32(0x7F800000)) == u32(0)) & ((b & u32(0x007FFFFF)) != u32(0))
    return select(sub, a * _TWO24, a), select(sub, i32(24), i32(0))


def _exp(x):
    xc = np.minimum(np.maximum(x, _EXP_LO), _EXP_HI)
    n = f32(np.floor(xc * _LOG2E + HALF))
    r = xc - n * _LN2_HI
    r = r - n * _LN2_LO
    p = _EXP_P0
    for c in _EXP_PS:
        p = p * r + c
    p = (p * (r * r) + r) + ONE
    return select(is_nan(bits(x)), x, _scale(p, i32(n)))


def _log(x):
    xn, k = _unsubnormal(x)
    b = bits(xn)
    e = i32(b >> u32(23)) - i32(126) - k
    m = from_bits((b & u32(0x007FFFFF)) | u32(0x3F000000))
    small = m < _SQRTHF
    e = select(small, e - i32(1), e)
    m = select(small, (m + m) - ONE, m - ONE)
    z = m * m
    y = _LOG_P0
    for c in _LOG_PS:
        y = y * m + c
    y = (y * m) * z
    fe = f32(e)
    y = y + fe * _LN2_LO
    y = y + z * f32(-0.5)
    r = m + y
    r = r + fe * _LN2_HI
    negative = ((b >> u32(31)) == u32(1)) & ((b & u32(0x7FFFFFFF)) != u32(0))
    r = select(is_zero(b), -INF, r)
    r = select(b == u32(0x7F800000), INF, r)
    r = select(negative, NAN, r)
    return select(is_nan(b), x, r)


def _recip(a):
    an, k = _unsubnormal(a)
    b = bits(an)
    sign = b & u32(0x80000000)
    e = i32((b >> u32(23)) & u32(0xFF))
    m = from_bits((b & u32(0x007FFFFF)) | u32(0x3F000000))   # [0.5, 1)
    y = _RCP_A - _RCP_B * m
    for _ in range(3):
        y = y + y * (ONE - m * y)
    r = _scale(y, i32(126) - e + k)
    r = select(is_zero(b), INF, r)
    r = select(e == i32(255), ZERO, r)
    r = from_bits(bits(r) | sign)
    return select(is_nan(b), a, r)


def _rsqrt(a):
    an, k = _unsubnormal(a)
    b = bits(an)
    y = from_bits(u32(_RSQRT_MAGIC - (b >> u32(1))))
    for _ in range(3):
        t = (an * y) * y
        y = y + y * (HALF - HALF * t)
    y = y * _pow2(k >> 1)
    y = select(is_zero(b), INF, y)
    y = select((b & u32(0x7FFFFFFF)) == u32(0x7F800000), ZERO, y)
    y = select(((b >> u32(31)) == u32(1)) & ((b & u32(0x7FFFFFFF)) != u32(0)), NAN, y)
    return select(is_nan(b), a, y)


def _sigmoid(x):
    return _recip(ONE + _exp(-x))


def _silu(x):
    return x * _sigmoid(x)


def _gelu_tanh(x):
    """GELU, tanh approximation: 0.5 x (1 + tanh(u)) = x sigmoid(2u),
    u = sqrt(2/pi) (x + 0.044715 x^3); built from exp and recip (no tanh),
    and more accurate than the 1 + tanh form where x is very negative."""
    u = _GELU_C * (x + _GELU_K * ((x * x) * x))
    return x * _sigmoid(u + u)


def _log1p(u):
    """log(1 + u) for u >= -1 (Goldberg: log(w) * u / (w - 1), w = 1 + u)."""
    w = ONE + u
    return select(w == ONE, u, _log(w) * (u * _recip(w - ONE)))


def _softplus(x):
    """log(1 + exp(x)), and x itself above 20 (torch's threshold)."""
    y = np.maximum(x, ZERO) + _log1p(_exp(-np.abs(x)))
    return select(x > _SOFTPLUS_THRESHOLD, x, y)


FORMULAS = (is_nan, is_zero, _pow2, _scale, _unsubnormal, _exp, _log, _recip, _rsqrt, _sigmoid, _silu,
            _log1p, _softplus, _gelu_tanh)


def _elementwise(formula, name: str):
    def f(x) -> np.ndarray:
        x = np.asarray(x, dtype=f32)
        with np.errstate(all="ignore"):
            return np.asarray(formula(x), dtype=f32)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"The float32 formula {formula.__name__} over an array."
    return f


exp, log, recip, rsqrt = (_elementwise(_exp, "exp"), _elementwise(_log, "log"),
                          _elementwise(_recip, "recip"), _elementwise(_rsqrt, "rsqrt"))
sigmoid, silu, softplus, log1p = (_elementwise(_sigmoid, "sigmoid"), _elementwise(_silu, "silu"),
                                  _elementwise(_softplus, "softplus"), _elementwise(_log1p, "log1p"))
gelu_tanh = _elementwise(_gelu_tanh, "gelu_tanh")

# core_eval.comp's `op` indexes this list
ELEMENTWISE = (exp, log, recip, rsqrt, sigmoid, silu, softplus, log1p, gelu_tanh)


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=f32)


# --- reductions --------------------------------------------------------------

def padded(k: int) -> int:
    return -(-k // REDUCE_STRIDE) * REDUCE_STRIDE


def _lanes(a: np.ndarray) -> np.ndarray:
    """(..., K) -> (..., steps, LANES, 4), zero-padded on the right."""
    k = a.shape[-1]
    kp = padded(max(k, 1))
    if kp != k:
        pad = np.zeros(a.shape[:-1] + (kp - k,), dtype=f32)
        a = np.concatenate([a.astype(f32, copy=False), pad], axis=-1)
    return a.reshape(a.shape[:-1] + (kp // REDUCE_STRIDE, REDUCE_LANES, REDUCE_VEC))


def _finish(acc: np.ndarray) -> np.ndarray:
    """(..., LANES, 4) lane accumulators -> (...): (x+y)+(z+w), then a tree."""
    s = (acc[..., 0] + acc[..., 1]) + (acc[..., 2] + acc[..., 3])
    stride = REDUCE_LANES // 2
    while stride:
        s = s[..., :stride] + s[..., stride:2 * stride]
        stride //= 2
    return s[..., 0]


def reduce_sum(x) -> np.ndarray:
    """Sum over the last axis in the canonical order."""
    xl = _lanes(_arr(x))
    acc = np.zeros(xl.shape[:-3] + xl.shape[-2:], dtype=f32)
    for c in range(xl.shape[-3]):
        acc = acc + xl[..., c, :, :]
    return _finish(acc)


def dot(x, w) -> np.ndarray:
    """Sum of x*w over the last axis (broadcasting), in the canonical order.

    Lane l of REDUCE_LANES keeps a 4-wide accumulator; at step c it adds the
    products of columns c*128 + 4l .. c*128 + 4l + 3. The lanes are folded as
    (x + y) + (z + w), then in a tree: lane l += lane l + s for s = 16, 8, .., 1.
    """
    xl, wl = _lanes(_arr(x)), _lanes(_arr(w))
    shape = np.broadcast_shapes(xl.shape, wl.shape)
    acc = np.zeros(shape[:-3] + shape[-2:], dtype=f32)
    with np.errstate(all="ignore"):
        for c in range(shape[-3]):
            acc = acc + xl[..., c, :, :] * wl[..., c, :, :]
        return _finish(acc)


def gemv(w: np.ndarray, x: np.ndarray, rows_per_chunk: int = 1024) -> np.ndarray:
    """y[r, m] = dot(x[r], w[m]) for x of shape (n, K) or (K,), w of (M, K).

    Every output row is computed exactly as :func:`dot` computes it alone; a
    block of n rows only shares the weight reads.
    """
    x = _arr(x)
    single = x.ndim == 1
    x2 = x[None, :] if single else x
    xl = _lanes(x2)[:, None]                     # (n, 1, steps, L, 4)
    out = np.empty((x2.shape[0], w.shape[0]), dtype=f32)
    for m0 in range(0, w.shape[0], rows_per_chunk):
        wl = _lanes(_arr(w[m0:m0 + rows_per_chunk]))[None]   # (1, M, steps, L, 4)
        acc = np.zeros((x2.shape[0], wl.shape[1], REDUCE_LANES, REDUCE_VEC), dtype=f32)
        with np.errstate(all="ignore"):
            for c in range(wl.shape[2]):
                acc = acc + xl[:, :, c] * wl[:, :, c]
            out[:, m0:m0 + wl.shape[1]] = _finish(acc)
    return out[0] if single else out


def rmsnorm(x, w, eps: float, inv_n=None) -> np.ndarray:
    """x * rsqrt(mean(x*x) + eps) * w over the last axis.

    ``w`` is the effective weight: pass ``1 + weight`` (computed once, in
    float32) for the ``(1 + w)`` form. ``inv_n`` is float32(1 / K).
    """
    x = _arr(x)
    k = x.shape[-1]
    inv_n = f32(1.0 / k) if inv_n is None else f32(inv_n)
    with np.errstate(all="ignore"):
        ms = dot(x, x) * inv_n
        r = rsqrt(ms + f32(eps))
        return (x * r[..., None]) * _arr(w)


def softmax(x, valid=None) -> np.ndarray:
    """exp(x - max x) * recip(sum exp(x - max x)) over the last axis. With a
    mask `valid`, entries outside it are +0 and take no part: the row's bits
    equal those of its valid prefix alone, as the padding's +0 adds nothing."""
    x = _arr(x)
    with np.errstate(all="ignore"):
        if valid is None:
            m = np.max(x, axis=-1, keepdims=True)
            e = exp(x - m)
        else:
            m = np.max(np.where(valid, x, f32(-np.inf)), axis=-1, keepdims=True)
            e = np.where(valid, exp(x - m), f32(0.0))
        return e * recip(reduce_sum(e))[..., None]


def argmax(x) -> np.ndarray:
    """Index of the largest value; ties go to the lowest index; NaN never wins."""
    x = _arr(x)
    clean = np.where(np.isnan(x), f32(-np.inf), x)
    return np.argmax(clean, axis=-1)


# --- integer arithmetic for quantised weights: q8 activations -----------------------
#
# With --activations q8 a GEMV over a block-format weight (formats/intform.py)
# quantises each input row per block to int8 and takes integer dot products,
# as llama.cpp does. Integer sums are exact in any order, so only the float
# part below has a defined order: per float block one combine, then the
# blocks' sum over Q8_LANES lanes. Every row is quantised on its own, so its
# bits never depend on the rows that share its forward.

Q8_MAX = 127               # never -128: a code's negation (the kernels' sign trick) stays a code
Q8_LANES = 8               # the float part's lanes (q8_reduce)
_Q8_INV_MAX = f32(1.0 / 127.0)
_ROUND_MAGIC = f32(12582912.0)          # 1.5 * 2**23: (v + M) - M rounds |v| < 2**22 half to even
_MIN_NORMAL = f32(2.0 ** -126)


def q8_round(v):
    """v rounded to an integer, half to even, for |v| < 2**22: two correctly
    rounded adds, the same on every IEEE device (the CPU's cvtps2dq agrees)."""
    return (v + _ROUND_MAGIC) - _ROUND_MAGIC


def quantize_q8(x, block: int):
    """(..., C) float32 -> (q int8 (..., C), d float32 (..., C // block)).

    Per block: d = max|x| * f32(1/127); q = round(x * recip(d)) clamped to
    [-127, 127]. recip is this file's (Newton from an exact seed), so every
    device gets the same d and q. A block holding an inf or NaN gets d = NaN
    (every output of its row is then NaN) and q = 0; a block whose d is below
    the smallest normal float (zeros, or only tiny values) gets d = 0, q = 0
    (recip of a subnormal would overflow)."""
    x = _arr(x)
    c = x.shape[-1]
    xb = x.reshape(x.shape[:-1] + (c // block, block))
    with np.errstate(all="ignore"):
        bad = np.any((bits(xb) & u32(0x7F800000)) == u32(0x7F800000), axis=-1)
        d = np.max(np.abs(xb), axis=-1) * _Q8_INV_MAX
        ok = ~bad & (d >= _MIN_NORMAL)
        r = q8_round(xb * recip(np.where(ok, d, ONE))[..., None])
        r = np.minimum(np.maximum(r, f32(-Q8_MAX)), f32(Q8_MAX))
        q = np.where(ok[..., None], r, ZERO).astype(np.int8)
        d = np.where(bad, NAN, np.where(ok, d, ZERO)).astype(f32)
    return q.reshape(x.shape), d


def q8_sums(q, group: int = 16) -> np.ndarray:
    """Integer sums of each `group` columns of q (..., C) -> int32 (..., C // group):
    the min terms' input (llama.cpp's q8_K bsums; a q8_1 block's sum is two of them)."""
    q = np.asarray(q)
    return q.reshape(q.shape[:-1] + (q.shape[-1] // group, group)).astype(np.int32).sum(axis=-1, dtype=np.int32)


def q8_combine(s1, dw, dx, s2=None, mw=None, sign: int = 1) -> np.ndarray:
    """One float block's contribution from its exact integer sums:
    (dw * dx) * float(s1), then + (mw * dx) * float(s2) (Q4_1, Q5_1: the
    added min) or - (dmin * dx) * float(s2) (Q2_K, Q4_K, Q5_K). s1 and s2
    are int32 and convert with one rounding (above 2**24 they round)."""
    with np.errstate(all="ignore"):
        a = (_arr(dw) * _arr(dx)) * np.asarray(s1, np.int32).astype(f32)
        if mw is None:
            return a
        b = (_arr(mw) * _arr(dx)) * np.asarray(s2, np.int32).astype(f32)
        return a + b if sign > 0 else a - b


def q8_reduce(c) -> np.ndarray:
    """(..., B) block contributions -> (...): block b goes to lane b mod 8;
    each lane adds its blocks in order from +0; the lanes fold as lane l +=
    lane l + s for s = 4, 2, 1. A lane is never -0, so padding with +0
    changes no bit."""
    c = _arr(c)
    nb = c.shape[-1]
    steps = max(1, -(-nb // Q8_LANES))
    if steps * Q8_LANES != nb:
        c = np.concatenate([c, np.zeros(c.shape[:-1] + (steps * Q8_LANES - nb,), f32)], axis=-1)
    cl = c.reshape(c.shape[:-1] + (steps, Q8_LANES))
    acc = np.zeros(c.shape[:-1] + (Q8_LANES,), f32)
    with np.errstate(all="ignore"):
        for s in range(steps):
            acc = acc + cl[..., s, :]
        stride = Q8_LANES // 2
        while stride:
            acc = acc[..., :stride] + acc[..., stride:2 * stride]
            stride //= 2
    return acc[..., 0]


def q8_dot(form, q, dx) -> np.ndarray:
    """y (n, r): rows of q8 activations (q int8 (n, C), dx (n, C // fb))
    against a weight's integer form (formats.intform.IntForm of r rows).

    The block dot is an integer sum: |w| <= 128 * 32 (Q6_K's scale times its
    centred 6-bit value; 8-bit scale times 4 bits elsewhere) and |q| <= 127,
    so a 256-column block's sum is below 256 * 4096 * 127 < 2**27, and the
    min term's 16 x 63 x (16 x 127) likewise: int32 never overflows."""
    n, cols = q.shape
    fb = form.fb
    nb = cols // fb
    wb = form.w.reshape(-1, nb, fb).astype(np.int64)
    qb = np.asarray(q).reshape(n, nb, fb).astype(np.int64)
    s1 = np.einsum("rbk,nbk->nrb", wb, qb).astype(np.int32)
    s2 = None
    if form.m is not None:
        sums = q8_sums(q).astype(np.int64)                     # (n, C // 16)
        if form.mn is None:                                    # "_1": the whole block's sum
            s2 = sums.reshape(n, nb, fb // 16).sum(axis=-1)[:, None, :]
        else:
            mn = form.mn.reshape(-1, nb, fb // 16).astype(np.int64)
            s2 = np.einsum("rbg,nbg->nrb", mn, sums.reshape(n, nb, fb // 16))
    m = None if form.m is None else form.m[None]
    return q8_reduce(q8_combine(s1, form.d[None], dx[:, None, :], s2, m, form.sign))
