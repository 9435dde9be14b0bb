"""The NumPy backend's ops: each is the executable definition of the shader of
the same name (gemv <-> gemv.comp; a shader's variants are one function, or
``<shader>_<variant>`` where they are separate steps: deltanet_prep <->
deltanet.comp's prep), built only from vkspec.exact. tests/test_structure.py
holds every shader to a function here.

The other functions (gemvs, act_gemv, expert_mlps, rope_attend, attend_row,
vecmats, l2norm, deltanet_step) are pieces or compositions of those
definitions, not shaders of their own: their compiled paths do a
composition in one call (gemvs: an rmsnorm then up to three GEMVs).
"""

from __future__ import annotations

import numpy as np

from ... import exact
from ...formats.intform import block_size, int_form
from ...formats.matrix import QWeight, dequantize
from . import expert_table, jit, jit_attend, jit_blocks, jit_math, jit_route, qdot

f32 = np.float32


def gemv(w: QWeight, x: np.ndarray, rows_per_chunk: int = 512) -> np.ndarray:
    """x (..., cols) -> (..., rows); every row as if alone. The definition
    decodes rows_per_chunk rows at a time (formats.matrix.dequantize) and takes
    exact.gemv; the compiled path (jit_blocks) decodes each row into a small
    buffer (VKSPEC_CPU_JIT=0 runs the definition: the same bits). A weight
    with q8 activations takes gemv_q8."""
    if w.acts == "q8":
        return gemv_q8(w, x)
    x = np.asarray(x, dtype=f32)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if jit.enabled():
        return jit_blocks.gemv(w, x2, logical=True).reshape(lead + (w.rows,))
    out = np.empty((x2.shape[0], w.rows), dtype=f32)
    for r0 in range(0, w.rows, rows_per_chunk):
        r1 = min(w.rows, r0 + rows_per_chunk)
        out[:, r0:r1] = exact.gemv(dequantize(w, r0, r1), x2)
    return out.reshape(lead + (w.rows,))


def gemv_q8(w: QWeight, x: np.ndarray) -> np.ndarray:
    """gemv's q8 variant: each row of x quantised per block to int8
    (exact.quantize_q8), integer dots with the weight's integer form and
    the float part in exact.q8_dot's order. Compiled: backends/cpu/qdot.py
    (the same bits)."""
    return gemvs_q8([w], x)[0]


def quantize_q8(x: np.ndarray, block: int):
    """Rows of x as q8 blocks of `block` columns: (q int8, d float32 per
    block, int32 sums of each 16 values), exact.quantize_q8 and exact.q8_sums."""
    q, d = exact.quantize_q8(x, block)
    return q, d, exact.q8_sums(q)


def gemvs_q8(ws, x: np.ndarray) -> list[np.ndarray]:
    """[gemv_q8(w, x) for w in ws], x quantised once per block size."""
    x = np.asarray(x, dtype=f32)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if jit.enabled():
        return [y.reshape(lead + (y.shape[-1],)) for y in qdot.gemvs(ws, x2)]
    quantised, outs = {}, []
    for w in ws:
        fb = block_size(w.fmt)
        if fb not in quantised:
            quantised[fb] = exact.quantize_q8(x2, fb)
        out = np.empty((x2.shape[0], w.rows), dtype=f32)
        for r0 in range(0, w.rows, 256):
            r1 = min(w.rows, r0 + 256)
            out[:, r0:r1] = exact.q8_dot(int_form(w, r0, r1), *quantised[fb])
        outs.append(out.reshape(lead + (w.rows,)))
    return outs


def gemvs(ws, x: np.ndarray, norm=None) -> list[np.ndarray]:
    """[gemv(w, x) for w in ws]: the matrices one input feeds (q, k and v;
    gate and up), in one compiled call where they are all in blocks; with
    norm = (w, eps), of rmsnorm(x, w, eps) (in the same call). With q8
    activations the input is normed once and quantised once per block size."""
    if any(w.acts == "q8" for w in ws):
        h = x if norm is None else rmsnorm(x, *norm)
        if all(w.acts == "q8" for w in ws):
            return gemvs_q8(ws, h)
        return [gemv(w, h) for w in ws]
    if not jit.enabled() or any(w.fmt == "f32" for w in ws):
        h = x if norm is None else rmsnorm(x, *norm)
        return [gemv(w, h) for w in ws]
    x = np.asarray(x, dtype=f32)
    outs = jit_blocks.gemv_many(ws, x.reshape(-1, x.shape[-1]), logical=True, norm=norm)
    return outs if x.ndim == 2 else [o.reshape(x.shape[:-1] + (o.shape[-1],)) for o in outs]


def act_gemv(w: QWeight, act: str, g, u) -> np.ndarray:
    """gemv(w, act_mul(act, g, u)): the MLP's down projection of its
    activation, in one compiled call where w is in blocks."""
    if w.acts == "q8":
        return gemv_q8(w, act_mul(act, g, u))
    if not jit.enabled() or w.fmt == "f32" or np.shape(g) != np.shape(u) or np.ndim(g) != 2:
        return gemv(w, act_mul(act, g, u))
    return jit_blocks.gemv_many([w], g, logical=True, up=u, act="gelu_tanh" if act == "gelu_tanh" else "silu")[0]


def _m():
    """exact itself, or its compiled twin (the same bits; see jit_math)."""
    return jit_math if jit.enabled() else exact


def embed(table: QWeight, tokens, scale: float = 1.0) -> np.ndarray:
    """The rows of the tokens, decoded from the table's format, times the
    float32 ``scale`` (Gemma's sqrt(hidden); times 1 changes no bit)."""
    ids = np.asarray(tokens).reshape(-1)
    rows = jit_blocks.decode(table, ids) if jit.enabled() else dequantize(table.take(ids))
    return rows if scale == 1.0 else rows * f32(scale)


def bias_add(x, b, acc=None) -> np.ndarray:
    """x + b, b added to every row; with ``acc`` (the acc variant) acc + (x + b):
    o_proj's output and bias, then the residual."""
    y = np.asarray(x, f32) + np.asarray(b, f32)
    return y if acc is None else acc + y


def silu_mul(g, u) -> np.ndarray:
    """The gated MLP's activation (compiled: the product in the same call)."""
    if jit.enabled() and np.shape(g) == np.shape(u):
        return jit_math.silu(g, times=u)
    return _m().silu(g) * u


def gelu_mul(g, u) -> np.ndarray:
    """The GELU-tanh gated MLP's activation (Gemma 3): gelu_tanh(g) * u."""
    if jit.enabled() and np.shape(g) == np.shape(u):
        return jit_math.gelu_tanh(g, times=u)
    return _m().gelu_tanh(g) * u


def act_mul(act: str, g, u) -> np.ndarray:
    return gelu_mul(g, u) if act == "gelu_tanh" else silu_mul(g, u)


def expert_mlps(w, h, idx, shared_act: str | None = None):
    """(n, k, H): row i's k routed experts, down(silu(gate h_i) * up h_i) each,
    every (row, expert) pair as if it ran alone: an expert runs over all the
    rows routed to it at once. With ``shared_act`` (the shared expert's
    activation): (that, the shared expert's output (n, H)), which one decode
    row computes in the same calls as its experts (expert_table)."""
    if idx.shape[0] == 1 and jit.enabled() and expert_table.applies(w, idx[0]):
        ys, shared = expert_table.one_row(w, np.asarray(idx[0], np.int64), h, shared_act)
        if shared_act is None:
            return ys
        return ys, (shared if shared is not None else shared_mlp(w.shared, h, shared_act))
    out = _routed(w, h, idx)
    return out if shared_act is None else (out, shared_mlp(w.shared, h, shared_act))


def shared_mlp(m, h, act: str) -> np.ndarray:
    """The shared expert: down(act(gate h) * up h), gate and up in one call."""
    return act_gemv(m.down, act, *gemvs([m.gate, m.up], h))


def _routed(w, h, idx) -> np.ndarray:
    out = np.empty(idx.shape + (h.shape[-1],), f32)
    routed = {}                 # the experts of each set of rows (a decode step: all k of its row)
    for e in np.unique(idx):
        rows, slot = np.nonzero(idx == e)
        routed.setdefault(rows.tobytes(), (rows, []))[1].append((w.experts[int(e)], slot))
    downs = []                  # (weight, its input, rows, slot): the q8 ones run in one call at the end
    q8 = all(m.gate.acts == m.up.acts == "q8" for _, ex in routed.values() for m, _ in ex)
    together = None
    if q8 and jit.enabled():
        # every gate and up of the layer in one call, each against its rows (qdot.gemvs_each: the
        # same bits as a call per row set; the matrices of one row set share one quantisation)
        ws = [[q for m, _ in ex for q in (m.gate, m.up)] for _, ex in routed.values()]
        xs = [h[rows] for rows, _ in routed.values()]
        ys = iter(qdot.gemvs_each([q for group in ws for q in group],
                                  [x for x, group in zip(xs, ws) for _ in group]))
        together = [[next(ys) for _ in group] for group in ws]
    for at, (rows, experts) in enumerate(routed.values()):
        if together is not None:
            gu = together[at]
        elif q8:                # the NumPy definition: one quantisation per row set
            gu = gemvs_q8([q for m, _ in experts for q in (m.gate, m.up)], h[rows])
        else:
            gu = [y for m, _ in experts for y in gemvs([m.gate, m.up], h[rows])]
        for j, (m, slot) in enumerate(experts):
            a = silu_mul(gu[2 * j], gu[2 * j + 1])
            if m.down.acts == "q8" and jit.enabled():
                downs.append((m.down, a, rows, slot))
            else:
                out[rows, slot] = gemv(m.down, a)
    if downs:                   # each down its own input (qdot.gemvs_each: the same bits as one call each)
        for (_, _, rows, slot), y in zip(downs, qdot.gemvs_each([d[0] for d in downs], [d[1] for d in downs])):
            out[rows, slot] = y
    return out


def moe_combine(x, ys, wts, shared=None, shared_logit=None) -> np.ndarray:
    """The residual x plus, per row, sum_j ys[j] * wts[j] in routing order
    from +0, plus sigmoid(logit) * shared. ys (n, k, H), wts (n, k), shared (n, H)."""
    if jit.enabled() and np.ndim(x) == 2:
        return jit_route.moe_combine(x, ys, wts, shared, shared_logit)
    acc = np.zeros(ys[:, 0].shape, f32)
    for j in range(ys.shape[1]):
        acc = acc + ys[:, j] * wts[:, j, None]
    if shared is not None:
        acc = acc + _m().sigmoid(shared_logit)[:, None] * shared
    return x + acc


def rmsnorm(x, w, eps: float, z=None, residual=None) -> np.ndarray:
    """(x * rsqrt(mean(x*x) + eps)) * w; times silu(z) with z (the gated
    variant: linear_attn.norm, plain w); residual + that with a residual (the
    acc variant: a sandwich norm on a sublayer's output, then the add)."""
    if residual is not None:
        return residual + rmsnorm(x, w, eps)
    if z is None:
        return _m().rmsnorm(x, w, eps)
    if jit.enabled():
        return jit_math.rmsnorm(x, w, eps, z)
    return exact.rmsnorm(x, w, eps) * exact.silu(z)


def l2norm(x, eps: float = 1e-6) -> np.ndarray:
    x = np.asarray(x, f32)
    if jit.enabled():
        return jit_math.l2norm(x, eps)
    return x * exact.rsqrt(exact.dot(x, x) + f32(eps))[..., None]


def rope(x, cos, sin, cache=None, pos=None) -> np.ndarray:
    """Rotate the first rotary_dim features of each head: x*cos + rotate_half(x)*sin.
    x (n, heads, hd); cos, sin (n, rotary_dim), rotary_dim 0 for none. With a
    cache (the cache variant) row r is written to cache[pos[r]] (the KV store)."""
    rd = cos.shape[-1]
    if jit.enabled():
        out = jit_math.rope(x, cos, sin)
    else:
        rot = x[..., :rd]
        half = rd // 2
        rh = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
        out = x.copy()
        out[..., :rd] = rot * cos[:, None, :] + rh * sin[:, None, :]
    if cache is not None:
        cache[pos] = out
    return out


def vecmats(x, v, lens=None, starts=None) -> np.ndarray:
    """(B, n, L), (B, L, D) -> (B, n, D): row r is dot(x[b, r, :lens[r]],
    v[b, :lens[r], d]) for every column d, in dot's order (lens: all of L).
    Columns before starts[r] add +0 and their v is never read."""
    lens = np.full(x.shape[1], x.shape[2]) if lens is None else np.asarray(lens)
    starts = np.zeros_like(lens) if starts is None else np.asarray(starts)
    out = np.empty((x.shape[0], x.shape[1], v.shape[2]), f32)
    for r, n in enumerate(lens):
        xr, vr = x[:, r, None, :n], v[:, :n]
        if starts[r]:                               # +0 terms: 0 * 0, whatever v holds there
            xr, vr = xr.copy(), vr.copy()
            xr[..., :starts[r]] = 0.0
            vr[:, :starts[r]] = 0.0
        out[:, r] = exact.dot(xr, vr.transpose(0, 2, 1))
    return out


def window_start(length, window: int):
    """The first key a query at position length-1 attends: keys at distance
    0..window-1 (transformers' sliding mask), all with window 0."""
    length = np.asarray(length)
    return np.maximum(length - window, 0) if window else np.zeros_like(length)


def attend(q, kc, vc, lens, scale, window: int = 0) -> np.ndarray:
    """Causal attention of a block: row i's q (nh, hd) over keys/values
    [0, lens[i]) of kc, vc (L, nkv, hd), each row exactly as if it ran alone;
    with a window, only the last `window` of them.

    The one rule for a key a row does not attend (past its length, or before
    its window): its probability is +0 and its value is never read, so the
    reductions keep the order of the whole row (a key's lane is its position
    mod 128) and such keys add nothing. attend.comp follows the same rule."""
    if not jit.enabled():
        return np.stack([attend_row(q[i], kc[:lens[i]], vc[:lens[i]], scale, window) for i in range(len(q))])
    # The compiled path (jit_attend): one work item per row and query head,
    # each reading only its own keys. A row's keys past its length or before
    # its window are never read; keys keep their lanes (position mod 128).
    return jit_attend.attend(q, kc, vc, lens, window, scale)


def rope_attend(q, k, v, cos, sin, kc, vc, pos, scale, window: int = 0) -> np.ndarray:
    """A block's attention with its own keys: k rotated into kc and v into
    vc at rows pos (rope's cache variant, the values as they are), then
    attend of q rotated, row i over keys up to pos[i]. q (n, nh, hd), k and
    v (n, nkv, hd), cos and sin (n, rd). The compiled path does the three in
    one call (jit_attend._attend: the same kernels, the same bits)."""
    lens = np.asarray(pos) + 1
    if not jit.enabled():
        rope(k, cos, sin, cache=kc, pos=pos)
        vc[pos] = v
        return attend(rope(q, cos, sin), kc, vc, lens, scale, window)
    return jit_attend.attend(q, kc, vc, lens, window, scale, new=(k, v, cos, sin, pos))


def attend_row(q, kc, vc, scale, window: int = 0) -> np.ndarray:
    """The definition: one row's q (nh, hd) over all of kc, vc (L, nkv, hd),
    or their last `window` rows: the others get probability +0 and their
    values are read as 0 (the row's reduction order is the whole row's)."""
    nh, nkv, L = q.shape[0], kc.shape[1], kc.shape[0]
    kv_of = np.arange(nh) // (nh // nkv)
    valid = np.arange(L) >= window_start(L, window)
    kh = kc.transpose(1, 0, 2)[kv_of]                    # (nh, L, hd)
    vh = np.where(valid, vc.transpose(1, 2, 0), f32(0))[kv_of]   # (nh, hd, L)
    s = exact.dot(q[:, None, :], kh) * f32(scale)        # (nh, L)
    p = exact.softmax(s, valid if window else None)
    return exact.dot(p[:, None, :], vh)                  # (nh, hd)


def _kv_of(nh: int, nkv: int) -> np.ndarray:
    return np.arange(nh) // (nh // nkv)


def attend_scores(q, kc, lens, scale, window: int = 0, out=None) -> np.ndarray:
    """attend.comp's scores pass: s[i, h, l] = dot(q[i, h], kc[l, kv head of h])
    * scale for the keys row i attends (window_start..lens[i]-1), as
    attend_row computes them; every other entry as it is in ``out`` (+0
    without one). q (n, nh, hd), kc (L, nkv, hd) -> (n, nh, L)."""
    n, nh = q.shape[:2]
    s = np.zeros((n, nh, kc.shape[0]), f32) if out is None else np.array(out, f32)
    heads = _kv_of(nh, kc.shape[1])
    for i, (lo, hi) in enumerate(zip(window_start(lens, window), lens)):
        kh = kc[lo:hi].transpose(1, 0, 2)[heads]               # (nh, keys, hd)
        s[i, :, lo:hi] = exact.dot(q[i][:, None, :], kh) * f32(scale)
    return s


def attend_softmax(s, lens, window: int = 0) -> np.ndarray:
    """attend.comp's softmax pass: each (row, head)'s attended scores become
    their probabilities, exact.softmax over keys 0..lens[i]-1 with the ones
    before the window masked (a key keeps its lane: its position mod 128);
    every other entry as it is. s (n, nh, L)."""
    p = np.array(s, f32)
    for i, (lo, hi) in enumerate(zip(window_start(lens, window), lens)):
        valid = np.arange(hi) >= lo
        p[i, :, lo:hi] = exact.softmax(p[i, :, :hi], valid if window else None)[:, lo:]
    return p


def attend_out(p, vc, lens, window: int = 0, gate=None) -> np.ndarray:
    """attend.comp's out pass (out_gated: times sigmoid(gate)): o[i, h] =
    dot(p[i, h, :lens[i]], vc[:lens[i], kv head of h]) over the keys, a key
    before the window adding +0 (its p and v read as 0, v never read).
    p (n, nh, L), vc (L, nkv, hd), gate (n, nh, hd) -> (n, nh, hd)."""
    n, nh = p.shape[:2]
    heads = _kv_of(nh, vc.shape[1])
    o = np.empty((n, nh, vc.shape[2]), f32)
    for i, (lo, hi) in enumerate(zip(window_start(lens, window), lens)):
        valid = np.arange(hi) >= lo
        pi = np.where(valid, p[i, :, :hi], f32(0))
        vh = np.where(valid, vc[:hi].transpose(1, 2, 0), f32(0))[heads]    # (nh, hd, keys)
        o[i] = exact.dot(pi[:, None, :], vh)
    return o if gate is None else o * sigmoid(gate)


def conv_step(ring, x, w) -> tuple[np.ndarray, np.ndarray]:
    """Causal depthwise conv of a block of rows x (n, C) over [ring (K-1 rows,
    oldest first), x], then silu; taps summed in order 0..K-1, every row as if
    alone. Returns (out (n, C), window): the ring after row i is
    window[i+1:i+K]; the caller keeps the last one."""
    window = np.concatenate([ring, x], axis=0)          # (K-1+n, C)
    if jit.enabled():
        return _m().silu(jit_math.conv_taps(window, w)), window
    n, taps = x.shape[0], w.shape[1]
    acc = np.zeros(x.shape, f32)
    for t in range(taps):
        acc = acc + w[:, t] * window[t:t + n]
    return _m().silu(acc), window


def deltanet_prep(q, k, b, a, dt_bias, neg_exp_a, scale):
    """The parts of the delta rule that need no state, for a block of rows:
    q, k (n, nk, dk) L2-normalised (q scaled by `scale`), beta = sigmoid(b),
    decay = exp(-exp(A_log) * softplus(a + dt_bias)), both (n, nv)."""
    q = l2norm(q) * f32(scale)
    k = l2norm(k)
    m = _m()
    return q, k, m.sigmoid(b), m.exp(neg_exp_a * m.softplus(a + dt_bias))


def deltanet_step(S, qh, kh, v, beta, decay) -> np.ndarray:
    """One row of the gated delta rule; updates S (nv, dk, dv) in place.

    S <- S * decay; delta = (v - S^T k) * beta; S <- S + k delta^T; o = S^T q,
    with q, k already repeated to the nv value heads."""
    S *= decay[:, None, None]
    kv_mem = vecmats(kh[:, None, :], S)[:, 0]                      # (nv, dv)
    delta = (v - kv_mem) * beta[:, None]
    S += kh[:, :, None] * delta[:, None, :]
    return vecmats(qh[:, None, :], S)[:, 0]


def deltanet_scan(S, q, k, v, beta, decay, keep: int = 0, room=None, src=None):
    """deltanet_step for rows 0..n-1 in turn (q, k (n, nv, dk), v (n, nv, dv),
    beta, decay (n, nv)); returns (out (n, nv, dv), S after each of the first
    `keep` rows (keep, nv, dk, dv), written into ``room`` when given). S is
    updated in place, starting from ``src`` when given (S's own values are
    then never read)."""
    if jit.enabled():
        return jit_math.deltanet_scan(S, q, k, v, beta, decay, keep, room, src)
    if src is not None:
        np.copyto(S, src)
    out = np.empty(v.shape, f32)
    snaps = np.empty((keep,) + S.shape, f32) if room is None else room[:keep]
    for i in range(len(q)):
        out[i] = deltanet_step(S, q[i], k[i], v[i], beta[i], decay[i])
        if i < keep:
            snaps[i] = S
    return out, snaps


def route(logits, k: int, normalize: bool):
    """Softmax over each row of router logits (n, E), its top-k experts (ties to
    the lower index) and their weights, renormalised if asked:
    (idx (n, k), weights (n, k))."""
    if jit.enabled():
        return jit_route.route(logits, k, normalize)
    probs = softmax(logits)
    idx = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    top = np.take_along_axis(probs, idx, axis=-1)
    if normalize:
        top = top * _m().recip(exact.reduce_sum(top))[..., None]
    return idx, top


def softmax(x) -> np.ndarray:
    return _m().softmax(x)


def sigmoid(x) -> np.ndarray:
    return _m().sigmoid(x)


def argmax(x) -> np.ndarray:
    return exact.argmax(x).astype(np.uint32)


def fill(y, n: int, x=None, x_off: int = 0, y_off: int = 0) -> np.ndarray:
    """fill.comp, which moves words without arithmetic: y with words
    y_off..y_off+n-1 zeroed (zero), or (copy) x's words x_off.. there."""
    out = np.array(y, copy=True)
    out[y_off:y_off + n] = 0 if x is None else np.asarray(x)[x_off:x_off + n]
    return out


class CpuOps:
    """The op set the Vulkan backend mirrors, as methods (tests compare the two)."""
    name = "cpu"

    def gemv(self, w, x):
        return gemv(w, x)

    def rmsnorm(self, x, w, eps):
        return rmsnorm(x, w, eps)

    def softmax(self, x):
        return softmax(x)

    def argmax(self, x):
        return argmax(x)

    def core_eval(self, x, op: int):
        return exact.ELEMENTWISE[op](x)
