"""The selftest's checks of the sequence mixers' shaders: attend.comp's three
passes (scores, softmax, out) each on its own, conv_step.comp and
deltanet.comp's two passes (prep, scan), with the recurrent state in regions
of its arena as the chain keeps it (the live one read, a row's copy written
to its slot). Each pass reads its NumPy twin's output of the pass before, so
a check holds one shader alone. See selftest_ops.py for the conventions."""

from __future__ import annotations

import numpy as np

from .backends.cpu import ops
from .backends.vulkan import graph as G
from .backends.vulkan.graph import groups
from .backends.vulkan.step import NO_SLOT
from .selftest_ops import Check, marked, normal
from .shaders import push as P

f32 = np.float32

# attention: 3 rows at positions past one 128-key block (a reduction of two
# steps), grouped-query heads, a head size that is no multiple of 4 lanes
N, NH, NKV, HD, L, KV_OFF = 3, 4, 2, 20, 140, 8
POS = np.array([129, 134, 139], np.uint32)
SCALE = f32(HD ** -0.5)
QW, PW = 2 * HD, 2 * NH * HD + 8            # the gated projection's q | gate heads and row width


def _attention(rng, window: int):
    """Inputs and the NumPy passes: q, the caches (L, NKV, HD), the
    projection whose heads hold the gates, scores and probabilities (n, NH, L)."""
    q, kc, vc = normal(rng, N, NH, HD), normal(rng, L, NKV, HD), normal(rng, L, NKV, HD)
    proj = normal(rng, N, PW, scale=2)
    scores = ops.attend_scores(q, kc, POS + 1, SCALE, window, out=marked(N, NH, L))
    return q, kc, vc, proj, scores, ops.attend_softmax(scores, POS + 1, window)


def _cache(c: np.ndarray) -> np.ndarray:
    """A cache in the KV arena after another layer's words."""
    return np.concatenate([np.full(KV_OFF, np.nan, f32), c.ravel()])


def attend(variant: str, window: int = 0):
    def run(vk, rng):
        q, kc, vc, proj, scores, probs = _attention(rng, window)
        common = dict(rows=N, heads=NH, kv_heads=NKV, hd=HD, s_stride=L, scale=SCALE, window=window)
        bufs = dict(q=q.reshape(N, NH * HD), kv=_cache(kc), s=marked(N * NH, L), o=np.zeros(4, f32),
                    step=vk.step(N, pos=POS))
        if variant == "scores":
            push, grid, read, want = P.Attend(q_stride=NH * HD, q_hstride=HD, kv_off=KV_OFF, **common), \
                (groups(L), N * NH), "s", scores.reshape(N * NH, L)
        elif variant == "softmax":
            bufs["s"] = scores.reshape(N * NH, L)
            push, grid, read, want = P.Attend(**common), (1, N * NH), "s", probs.reshape(N * NH, L)
        else:
            o_stride, gated = 128, variant == "out_gated"
            gate = proj[:, :NH * QW].reshape(N, NH, QW)[:, :, HD:] if gated else None
            o = marked(N, o_stride)
            o[:, :NH * HD] = ops.attend_out(probs, vc, POS + 1, window, gate).reshape(N, NH * HD)
            bufs.update(q=proj, kv=_cache(vc), s=probs.reshape(N * NH, L), o=marked(N, o_stride))
            push = P.Attend(q_stride=PW, q_hstride=QW, gate_off=HD, o_stride=o_stride, kv_off=KV_OFF, **common)
            grid, read, want = (groups(HD), N * NH), "o", o
        return [(want, *vk.dispatch(G.ATTEND, variant, grid, push, read=(read,), **bufs))]
    return run


# the DeltaNet: 3 rows, 2 key heads of 12, 4 value heads of 8; the state in 3 regions
ROWS, NK, NV, DK, DV, K = 3, 2, 4, 12, 8, 4
CD = 2 * NK * DK + NV * DV                  # conv channels: q | k | v
PROJ = CD + NV * DV + 2 * NV                # a projection row: q | k | v | z | b | a
PREP = 2 * NK * DK + 2 * NV                 # a prep row: q | k | beta | decay
LIVE, SLOTS = 1, [0, NO_SLOT, 2]            # row 1 keeps no copy; the last row's region becomes live


def conv_step(vk, rng):
    """The conv over 3 rows of the projection from the ring's live region;
    the ring after rows 0 and 2 into their slots."""
    C, r_off, w_off = CD, 2, 3
    region = (K - 1) * C
    proj, w = normal(rng, ROWS, PROJ, scale=2), normal(rng, w_off + C * K)
    ring = normal(rng, r_off + 3 * region)
    out, window = ops.conv_step(ring[r_off + LIVE * region:][:region].reshape(K - 1, C), proj[:, :C],
                                w[w_off:].reshape(C, K))
    want_ring = ring.copy()
    for r, sl in enumerate(SLOTS):
        if sl != NO_SLOT:
            want_ring[r_off + sl * region:][:region] = window[r + 1:r + K].ravel()
    push = P.ConvStep(rows=ROWS, channels=C, k=K, x_stride=PROJ, y_stride=C, w_off=w_off, r_off=r_off)
    y, got_ring = vk.dispatch(G.CONV_STEP, None, groups(C), push, read=("y", "ring"), x=proj, w=w, ring=ring,
                              y=marked(ROWS, C), step=vk.step(ROWS, live=LIVE, slots=SLOTS))
    return [(out, y), (want_ring, got_ring)]


def _deltanet_inputs(rng):
    mixed, proj = normal(rng, ROWS, CD, scale=2), normal(rng, ROWS, PROJ, scale=2)
    mixed[1, :DK] = 0.0                         # a zero head: l2norm of +0
    par = np.concatenate([np.full(3, np.nan, f32), normal(rng, NV), -np.exp(normal(rng, NV))])
    q, k = mixed[:, :NK * DK].reshape(ROWS, NK, DK), mixed[:, NK * DK:2 * NK * DK].reshape(ROWS, NK, DK)
    ba = proj[:, CD + NV * DV:]
    prep = ops.deltanet_prep(q, k, ba[:, :NV], ba[:, NV:], par[3:3 + NV], par[3 + NV:], f32(DK ** -0.5))
    return mixed, proj, par, prep


def deltanet(variant: str, tiled: int = 0):
    """prep: q, k L2-normed, beta and decay of each row; scan: the delta
    rule over the rows from the live state region, the state after rows 0
    and 2 into their slots."""
    def run(vk, rng):
        mixed, proj, par, (q, k, beta, decay) = _deltanet_inputs(rng)
        region, s_off = NV * DK * DV, 4
        prep = np.concatenate([q.reshape(ROWS, -1), k.reshape(ROWS, -1), beta, decay], axis=1)
        state = normal(rng, s_off + 3 * region)
        push = P.Deltanet(rows=ROWS, nk=NK, nv=NV, dk=DK, dv=DV, m_stride=CD, ba_off=CD + NV * DV, ba_stride=PROJ,
                          o_stride=NV * DV, scale=f32(DK ** -0.5), eps=f32(1e-6), p_off=3, s_off=s_off, tiled=tiled)
        bufs = dict(mixed=mixed, ba=proj, par=par, prep=marked(ROWS, PREP), state=state, o=marked(ROWS, NV * DV),
                    step=vk.step(ROWS, live=LIVE, slots=SLOTS))
        if variant == "prep":
            got = vk.dispatch(G.DELTANET, "prep", groups(ROWS * (2 * NK + NV)), push, read=("prep",), **bufs)
            return [(prep, *got)]
        rep = np.arange(NV) % NK if tiled else np.arange(NV) // (NV // NK)
        S = state[s_off + LIVE * region:][:region].reshape(NV, DK, DV).copy()
        out, snaps = ops.deltanet_scan(S, q[:, rep], k[:, rep], mixed[:, 2 * NK * DK:].reshape(ROWS, NV, DV),
                                       beta, decay, ROWS)
        want_state = state.copy()
        for r, sl in enumerate(SLOTS):
            if sl != NO_SLOT:
                want_state[s_off + sl * region:][:region] = snaps[r].ravel()
        bufs["prep"] = prep
        o, got_state = vk.dispatch(G.DELTANET, "scan", groups(NV * DV), push, read=("o", "state"), **bufs)
        return [(out.reshape(ROWS, NV * DV), o), (want_state, got_state)]
    return run


CHECKS = [
    *(Check(f"attend.{v}" + (f" window {w}" if w else ""), attend(v, w))
      for v in ("scores", "softmax", "out", "out_gated") for w in (0, 7)),
    Check("conv_step", conv_step),
    Check("deltanet.prep", deltanet("prep")),
    Check("deltanet.scan", deltanet("scan")),
    Check("deltanet.scan tiled", deltanet("scan", tiled=1)),
]
