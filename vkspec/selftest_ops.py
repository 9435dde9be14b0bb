"""The selftest's checks of the chain's ops other than the GEMVs
(selftest_gemv.py has those): each runs one shader variant once on the
device, with the buffers, push constants, grid and Step block the chain
gives it (backends/vulkan/recorder.py), and its NumPy twin
(backends/cpu/ops.py) on the same inputs.

A check returns (NumPy's, the device's) pairs of whole output buffers: the
words an op must leave alone start as MARK on both sides, so a stray write
differs too. Buffers start a little way in where the chain's arenas put a
layer's (offsets in the push constants) and rows are strided as in the chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import exact, ieee
from .backends.cpu import ops
from .backends.vulkan import graph as G
from .backends.vulkan.graph import groups
from .backends.vulkan.immediate import weight_buffers
from .formats.matrix import FORMATS
from .formats.samples import random_weight
from .shaders import push as P

f32 = np.float32
MARK = f32(-3.25)
EPS = 1e-6

EDGE = np.array([0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 1e-40, 1.17549435e-38, 3.4e38, -3.4e38,
                 np.inf, -np.inf, np.nan, 88.72, 88.73, -87.3, -103.0, -104.5, 20.0, 20.5,
                 1e-7, 1e7], dtype=np.float32)


def inputs(seed, n: int = 4096) -> np.ndarray:
    """EDGE, then values of every magnitude, then moderate ones (seed: an
    int or a numpy Generator)."""
    rng = np.random.default_rng(seed)
    wide = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    return np.concatenate([EDGE, wide, rng.uniform(-30, 30, n).astype(np.float32)])


@dataclass(frozen=True)
class Check:
    name: str                 # "<stem>[.<variant>] <what>": the shader variant it runs
    run: Callable             # (vk, rng) -> [(NumPy's array, the device's)]


def normal(rng, *shape, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(f32)


def marked(*shape) -> np.ndarray:
    return np.full(shape, MARK, f32)


def at(off: int, stride: int, rows: int, n: int, inner: int = 0, group: int = 1) -> np.ndarray:
    """Indices (rows, n) of rows laid out as rmsnorm.comp's at(): row r from
    off + (r / group) * stride + (r % group) * inner."""
    r = np.arange(rows)
    return (off + (r // group) * stride + (r % group) * inner)[:, None] + np.arange(n)


def core_eval(i: int):
    """One function of the exact core (exact.ELEMENTWISE) on edge values and
    values of every magnitude."""
    def run(vk, rng):
        x = inputs(rng)
        return [(exact.ELEMENTWISE[i](x), vk.core_eval(x, i))]
    return run


def float_probe(vk, rng):
    """The start-up probe's cases against vkspec/ieee.py's exact answers
    (the ones the contract leaves open are left out)."""
    got = vk.float_probe()
    keep = [i for i, c in enumerate(ieee.CASES) if c.want != ieee.ANY]
    want = [0x7FC00000 if ieee.CASES[i].want == ieee.NAN else ieee.CASES[i].want for i in keep]
    return [(np.array(want, np.uint32).view(f32), got[keep].view(f32))]


# --- norms and row ops ----------------------------------------------------------------
def rmsnorm(variant: str):
    """plain: rows of a strided buffer from an offset (the final norm's
    last rows); acc: y += the norm (a sandwich norm's residual add); gated:
    per-head rows (group, inner) times silu(z), as the DeltaNet's norm."""
    def run(vk, rng):
        gated = variant == "gated"
        rows, n, group = (6, 16, 3) if gated else (5, 200, 1)
        xs, xi, ys, yi = (48, 16, 52, 16) if gated else (208, 0, 208, 0)
        xo, wo, yo = (0, 5, 0) if gated else (xs, 5, 3)
        x = normal(rng, rows + 1, xs, scale=3)
        x[1] = 0.0
        x[2] *= f32(1e-22)                          # the mean of squares in the denormals
        w = normal(rng, wo + n)
        y = normal(rng, yo + rows * ys) if variant == "acc" else marked(yo + rows * ys)
        ix, iy = at(xo, xs, rows, n, xi, group), at(yo, ys, rows, n, yi, group)
        zs = dict(z_off=7, z_stride=100, z_inner=16) if gated else {}     # z: heads of the projection rows
        push = P.Rmsnorm(rows=rows, n=n, group=group, x_off=xo, x_stride=xs, x_inner=xi, w_off=wo, y_off=yo,
                         y_stride=ys, y_inner=yi, eps=EPS, inv_n=f32(1.0 / n), **zs)
        bufs = dict(x=x.ravel(), w=w, y=y)
        want = y.copy()
        if gated:
            z = normal(rng, 7 + 2 * 100, scale=4)
            bufs["z"] = z
            want[iy] = ops.rmsnorm(x.ravel()[ix], w[wo:], EPS, z=z[at(7, 100, rows, n, 16, group)])
        else:
            want[iy] = ops.rmsnorm(x.ravel()[ix], w[wo:], EPS, residual=y[iy] if variant == "acc" else None)
        op = G.RMSNORM_GATED if gated else G.RMSNORM
        return [(want, *vk.dispatch(op, variant, groups(rows), push, read=("y",), **bufs))]
    return run


def bias_add(variant: str):
    """inplace: y += b on strided rows (a fused q|k|v projection's biases);
    acc: y += x + b (o_proj's output and bias, then the residual)."""
    def run(vk, rng):
        rows, n, ys, yo, bo = 3, 40, 50, 2, 5
        y, b, x = normal(rng, yo + rows * ys), normal(rng, bo + n), normal(rng, rows, n, scale=4)
        iy = at(yo, ys, rows, n)
        want = y.copy()
        push = P.BiasAdd(rows=rows, n=n, y_off=yo, y_stride=ys, b_off=bo, x_stride=n if variant == "acc" else 0)
        if variant == "acc":
            want[iy] = ops.bias_add(x, b[bo:], acc=y[iy])
            got = vk.dispatch(G.BIAS_ADD_ACC, "acc", groups(rows * n), push, read=("y",), x=x, b=b, y=y)
        else:
            want[iy] = ops.bias_add(y[iy], b[bo:])
            got = vk.dispatch(G.BIAS_ADD, "inplace", groups(rows * n), push, read=("y",), y=y, b=b)
        return [(want, *got)]
    return run


def act_mul(stem: str):
    """act(g) * u from one [gate; up] projection row into a padded row."""
    def run(vk, rng):
        rows, n, ys = 3, 50, 52
        x = np.concatenate([inputs(rng, 64)[:rows * n].reshape(rows, n), normal(rng, rows, n, scale=2)], axis=1)
        y = marked(rows, ys)
        want = y.copy()
        want[:, :n] = getattr(ops, stem)(x[:, :n], x[:, n:])
        op, push = (G.SILU_MUL, P.SiluMul) if stem == "silu_mul" else (G.GELU_MUL, P.GeluMul)
        got = vk.dispatch(op, None, groups(rows * n), push(rows=rows, n=n, x_stride=2 * n, y_stride=ys),
                          read=("y",), x=x, y=y)
        return [(want, *got)]
    return run


def softmax(vk, rng):
    rows = (rng.standard_normal((6, 1000)) * 3).astype(f32)
    return [(ops.softmax(rows), vk.softmax(rows))]


def argmax(vk, rng):
    rows = (rng.standard_normal((6, 1000)) * 3).astype(f32)
    rows[1, 5:9] = rows[1].max() + 1                # ties: the lowest index
    rows[2, 3] = np.nan                             # NaN never wins
    return [(ops.argmax(rows), vk.argmax(rows))]


def fill(variant: str):
    """Words moved by 64 invocations striding past their first word."""
    def run(vk, rng):
        n, xo, yo = 150, 5, 3
        x, y = (rng.integers(0, 1 << 32, 200, dtype=np.uint64).astype(np.uint32) for _ in range(2))
        want = ops.fill(y, n, x if variant == "copy" else None, xo, yo)
        got = vk.dispatch(G.FILL, variant, 1, P.Fill(n=n, x_off=xo, y_off=yo), read=("y",),
                          x=x if variant == "copy" else y, y=y)
        return [(want, *got)]
    return run


# --- the embedding and RoPE ----------------------------------------------------------------
def embed(fmt: str):
    """The tokens' rows of one part of a table (rows 8..39): a token that
    another part holds is left alone. Times a scale (Gemma's)."""
    def run(vk, rng):
        table, first, H, ys, scale = random_weight(fmt, 40, 256, rng), 8, 256, 260, f32(0.70710677)
        part = table.rows_of(first, 40)
        tokens = np.array([0, 39, 8, 21, 21], np.uint32)
        n, inside = len(tokens), tokens >= first
        y = marked(n, ys)
        want = y.copy()
        want[inside, :H] = ops.embed(table, tokens[inside], scale)
        w, s = weight_buffers(part)
        push = P.Embed(rows=n, n=H, y_stride=ys, row_bytes=part.row_bytes, s_stride=part.scales_per_row,
                       first_row=first, part_rows=part.rows, scale=scale)
        got = vk.dispatch(G.EMBED, FORMATS[fmt].variant, groups(n * H), push, read=("y",), w=w, scales=s, y=y,
                          step=vk.step(n, tokens=tokens))
        return [(want, *got)]
    return run


def rope(variant: str, rot: int):
    """rows: q heads of a gated projection (two halves a head) at their
    positions; cache: k (or, with rot 0, v as it is) into the cache arena
    rows of their positions."""
    def run(vk, rng):
        n, hd, ctx, xo, xs = 3, 16, 12, 4, 160       # xs: a projection row (q | gate heads, k, v)
        heads, xh = (4, 2 * hd) if variant == "rows" else (2, hd)
        pos = np.array([3, 11, 7], np.uint32)
        x = normal(rng, xo + n * xs, scale=2)
        x[[5, 40, 77]] = [-0.0, np.inf, 1e-40]
        cos, sin = normal(rng, ctx, rot), normal(rng, ctx, rot)
        ix = (xo + np.arange(n)[:, None, None] * xs + np.arange(heads)[:, None] * xh + np.arange(hd))
        yo = 32 if variant == "cache" else 0
        y = normal(rng, yo + ctx * heads * hd) if variant == "cache" else marked(n, heads * hd)
        want = y.copy()
        if variant == "cache":
            ops.rope(x[ix], cos[pos], sin[pos], cache=want[yo:].reshape(ctx, heads, hd), pos=pos)
        else:
            want[:] = ops.rope(x[ix], cos[pos], sin[pos]).reshape(n, heads * hd)
        push = P.Rope(rows=n, heads=heads, hd=hd, rot=rot, x_off=xo, x_stride=xs, x_hstride=xh, y_off=yo,
                      y_stride=heads * hd)
        got = vk.dispatch(G.ROPE, variant, groups(n * heads * hd), push, read=("y",), x=x, cos=cos.ravel(),
                          sin=sin.ravel(), y=y, step=vk.step(n, pos=pos))
        return [(want, *got)]
    return run


# --- experts -------------------------------------------------------------------------------
def route(normalize: int):
    """The top 3 of 8 experts from router rows that carry one more logit
    (the shared expert's gate), into the layer's rows of the routing buffers."""
    def run(vk, rng):
        rows, E, k, xs, yo = 3, 8, 3, 9, 6
        logits = normal(rng, rows, xs, scale=2)
        logits[2, :E] = 0.5                         # ties: the lower index first
        idx, wt = np.full(yo + rows * k, 0xDEADBEEF, np.uint32), marked(yo + rows * k)
        i, w = ops.route(logits[:, :E], k, bool(normalize))
        want_i, want_w = idx.copy(), wt.copy()
        want_i[yo:], want_w[yo:] = i.astype(np.uint32).ravel(), w.ravel()
        push = P.Route(rows=rows, n=E, k=k, x_stride=xs, normalize=normalize, y_off=yo)
        got_i, got_w = vk.dispatch(G.ROUTE, None, groups(rows), push, read=("idx", "wt"), logits=logits.ravel(),
                                   idx=idx, wt=wt)
        return [(want_i, got_i), (want_w, got_w)]
    return run


def moe_combine(variant: str):
    """x rows (from an offset) += their k experts' outputs times their
    routing weights; shared: + sigmoid(gate logit) * the shared expert's."""
    def run(vk, rng):
        rows, H, k, E, xs, xo, wo = 3, 40, 2, 8, 44, 44, 4
        shared = variant == "shared"
        x, y = normal(rng, xo + rows * xs, scale=3), normal(rng, rows * k, H)
        wt, sh, gate = normal(rng, wo + rows * k), normal(rng, rows, H), normal(rng, rows, E + 1, scale=3)
        ix = at(xo, xs, rows, H)
        want = x.copy()
        want[ix] = ops.moe_combine(x[ix], y.reshape(rows, k, H), wt[wo:].reshape(rows, k),
                                   sh if shared else None, gate[:, E] if shared else None)
        push = P.MoeCombine(rows=rows, n=H, k=k, x_off=xo, x_stride=xs, y_stride=H, s_stride=H, g_stride=E + 1,
                            g_off=E, w_off=wo)
        got = vk.dispatch(G.MOE_COMBINE, variant, groups(rows * H), push, read=("x",), x=x, y=y, wt=wt, sh=sh,
                          gate=gate)
        return [(want, *got)]
    return run


CHECKS = [
    *(Check(f"core_eval {f.__name__}", core_eval(i)) for i, f in enumerate(exact.ELEMENTWISE)),
    Check("float_probe", float_probe),
    *(Check(f"rmsnorm.{v}", rmsnorm(v)) for v in ("plain", "acc", "gated")),
    *(Check(f"embed.{FORMATS[f].variant}", embed(f)) for f in FORMATS),
    Check("rope.rows rot 8 of 16", rope("rows", 8)),
    Check("rope.cache rot 8 of 16", rope("cache", 8)),
    Check("rope.cache rot 0 (values)", rope("cache", 0)),
]

ROW_CHECKS = [
    *(Check(f"bias_add.{v}", bias_add(v)) for v in ("inplace", "acc")),
    Check("silu_mul", act_mul("silu_mul")),
    Check("gelu_mul", act_mul("gelu_mul")),
    Check("route normalised", route(1)),
    Check("route", route(0)),
    *(Check(f"moe_combine.{v}", moe_combine(v)) for v in ("routed", "shared")),
    Check("argmax", argmax),
    Check("softmax", softmax),
    *(Check(f"fill.{v}", fill(v)) for v in ("zero", "copy")),
]
