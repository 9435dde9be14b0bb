"""One recorded sequence per step shape: the whole forward of a block on the
device, dispatch after dispatch, replayed with one eval() per forward.

A **shape** is (pass, rows, attention bucket, last, listed): the trunk
(Pass.MAIN) or the MTP head (Pass.MTP); 1..MAX_ROWS rows; the attention span
rounded up to a bucket; whether only the last row goes on to the lm_head;
and the padded length of a draft vocabulary the head scores (0: all of it).
Push constants are fixed at record time; what changes per step goes through
the Step block (step.py).
"""

from __future__ import annotations

import os

import numpy as np

from ...errors import VkspecError
from ...shaders import push as P
from . import graph as G
from .graph import Pass, Recording, groups
from ...layer_graph import Norm, Sub, Sublayer
from .layout import MAX_ROWS, P as padded, Buffers, Layer, Layout
from .buffers import DevWeight, q8_words
from ...formats.intform import block_size


def gemv_layout(dev) -> str:
    """gemv.comp's lane layout for this device: "parallel" (the 32 lanes of a
    row across 32 invocations: coalesced reads, for GPUs), or "serial" (one
    invocation walks a row) on Lavapipe, where it runs faster. The
    bits are the same. VKSPEC_GEMV_LANES=parallel|serial overrides."""
    env = os.environ.get("VKSPEC_GEMV_LANES", "")
    if env:
        if env not in P.Gemv.ROWS_PER_GROUP:
            raise VkspecError(f"VKSPEC_GEMV_LANES={env!r}: use one of {', '.join(P.Gemv.ROWS_PER_GROUP)}")
        return env
    return "serial" if "llvmpipe" in dev.name.lower() else "parallel"


ADDRESSING = ("", "routed", "rowmap")    # rows in order; an expert's rows per pair; a listed set


def gemv_variant(fmt: str, addressing: str, layout: str) -> str:
    """The variant of gemv.comp / gemv_q8.comp (their `// variants:` lines)
    for a weight format's variant name, how its rows are addressed and the
    lane layout: format, then routed | rowmap, then serial."""
    if addressing not in ADDRESSING or layout not in P.Gemv.ROWS_PER_GROUP:
        raise ValueError(f"no gemv variant for addressing {addressing!r}, lanes {layout!r}")
    return "_".join(p for p in (fmt, addressing, "serial" if layout == "serial" else "") if p)


def gemv_dispatch(fmt: str, rows: int, layout: str, addressing: str = "") -> tuple[str, int]:
    """The gemv.comp variant and workgroups along x for `rows` output rows."""
    return gemv_variant(fmt, addressing, layout), groups(rows, P.Gemv.ROWS_PER_GROUP[layout])


def q8_dispatch(fmt: str, rows: int, layout: str, addressing: str = "") -> tuple[str, int]:
    """gemv_q8.comp's variant and workgroups along x, in gemv's lane layout."""
    return gemv_variant(fmt, addressing, layout), groups(rows, P.Gemv.Q8_ROWS_PER_GROUP[layout])


# gemv.comp's formats whose 32-column blocks w_block32 reads whole
BLOCK32 = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")


def gemv_spec(layout: str, nvec: int, fmt: str) -> tuple:
    """gemv.comp's specialization constants (NVEC, INV_ROWS, workgroup width)
    for `nvec` input rows: the serial layout compiles one pipeline per count,
    so its loops unroll. More weight rows an invocation read each input vec4
    fewer times (Lavapipe's cost) but make a bigger pipeline to compile: 4
    rows for every count of the block formats gave the lower T(n)/T(1) on
    Lavapipe, and a K-quant's pipeline with 2 rows compiles in a time of the
    same order as a block format's."""
    if layout != "serial":
        return ()
    inv_rows = 4 if fmt in BLOCK32 else (2 if nvec <= 4 else 1)
    return (nvec, inv_rows, P.Gemv.ROWS_PER_GROUP["serial"] // inv_rows)


class Recorder:
    def __init__(self, layout: Layout, buffers: Buffers, dev, up, tier=None):
        self.lay, self.b, self.dev, self.up, self.tier = layout, buffers, dev, up, tier
        self.lanes = gemv_layout(dev)
        self.d, self.s, self.cfg = layout.dims, buffers.scratch, layout.cfg
        self.algos: dict = {}

    def forget(self, tensors: set[int]):
        """Drop the algorithms bound to these tensors (ids): they were replaced."""
        self.algos = {k: a for k, a in self.algos.items() if not tensors & set(k[1])}

    # --- op helpers -----------------------------------------------------------
    def gemv(self, w: DevWeight, x, y, rows, x_off=0, x_stride=None, y_off=0, y_stride=None, acc=False,
             row_of=None, out_rows=None):
        """y = w x for `rows` input rows, one dispatch per part of w; with
        ``row_of`` (a device list of weight rows) only those ``out_rows`` rows
        of w, in the list's order. A q8 part reads x quantised once per block
        size (quantize_q8)."""
        m = out_rows or w.rows
        x_stride = x_stride or padded(w.cols)
        common = dict(cols=w.cols, nvec=rows, y_stride=m if y_stride is None else y_stride)
        quantised: dict[int, dict] = {}
        rowmap = row_of is not None
        assert not (rowmap and acc)
        for part in w.parts:
            fmt = dict(row_bytes=part.row_bytes, s_stride=part.s_stride, w_off=part.w_off, s_off=part.s_off)
            out, addressing = (m, "rowmap") if rowmap else (part.rows, "")
            if part.acts == "q8":
                fb = block_size(part.fmt)
                if fb not in quantised:
                    quantised[fb] = self.quantize(x, rows, x_off, x_stride, w.cols, fb)
                op, at, src = (G.GEMV_Q8_ROWMAP if rowmap else G.GEMV_Q8), quantised[fb], dict(q=self.s.q8)
                (variant, gx), spec = q8_dispatch(part.variant, out, self.lanes, addressing), (rows,)
            else:
                op, at, src = (G.GEMV_ROWMAP if rowmap else G.GEMV), dict(x_off=x_off, x_stride=x_stride), dict(x=x)
                (variant, gx) = gemv_dispatch(part.variant, out, self.lanes, addressing)
                spec = gemv_spec(self.lanes, rows, part.variant)
            if rowmap:
                push = P.Gemv(rows=m, y_off=y_off, first_row=part.first_row, part_rows=part.rows, **fmt, **common,
                              **at)
                src["row_of"] = row_of
            else:
                push = P.Gemv(rows=part.rows, y_off=y_off + part.first_row, acc=int(acc), **fmt, **common, **at)
            self.rec.op(op, variant, gx, push, spec=spec, w=part.data, scales=part.scales, y=y, **src)

    def quantize(self, x, rows, x_off, x_stride, cols, fb) -> dict:
        """Rows of x as q8 blocks of fb columns in the q8 scratch's region for
        fb; the x_off and x_stride of a gemv_q8 push that reads them."""
        q_stride = q8_words(cols, fb)
        q_off = 0 if fb == 256 else self.lay.q8_region
        self.rec.op(G.QUANTIZE_Q8, f"b{fb}", (groups(cols, 256), rows),
                    P.QuantizeQ8(rows=rows, cols=cols, x_off=x_off, x_stride=x_stride, q_off=q_off,
                                 q_stride=q_stride), x=x, q=self.s.q8)
        return dict(x_off=q_off, x_stride=q_stride)

    def routed(self, w: DevWeight, x, y, pairs, x_div, x_stride, y_stride, per_expert_rows, smap, idx_off):
        part = w.single
        push = dict(rows=per_expert_rows, cols=w.cols, nvec=pairs, y_stride=y_stride,
                    row_bytes=part.row_bytes, s_stride=part.s_stride, w_off=part.w_off, s_off=part.s_off,
                    w_expert=per_expert_rows * part.row_bytes, s_expert=per_expert_rows * part.s_stride,
                    x_div=x_div, idx_off=idx_off)
        if part.acts == "q8":
            at = self.quantize(x, -(-pairs // x_div), 0, x_stride, w.cols, block_size(part.fmt))
            variant, gx = q8_dispatch(part.variant, per_expert_rows, self.lanes, "routed")
            self.rec.op(G.GEMV_Q8_ROUTED, variant, (gx, pairs), P.Gemv(**push, **at), spec=(1,),
                        w=part.data, scales=part.scales, q=self.s.q8, y=y, idx=self.s.ridx, slot_of=smap)
            return
        variant, gx = gemv_dispatch(part.variant, per_expert_rows, self.lanes, "routed")
        self.rec.op(G.GEMV_ROUTED, variant, (gx, pairs), P.Gemv(**push, x_stride=x_stride),
                    spec=gemv_spec(self.lanes, 1, part.variant),
                    w=part.data, scales=part.scales, x=x, y=y, idx=self.s.ridx, slot_of=smap)

    def embed(self, y, n, step, scale=1.0):
        """The rows of the step's tokens from the embedding table (times
        scale), one dispatch per part."""
        d, t = self.d, self.b.embed
        for part in t.parts:
            self.rec.op(G.EMBED, part.variant, groups(n * d.H),
                        P.Embed(rows=n, n=d.H, y_stride=d.Hp, row_bytes=part.row_bytes, s_stride=part.s_stride,
                                first_row=part.first_row, part_rows=part.rows, scale=np.float32(scale)),
                        w=part.data, scales=part.scales, y=y, step=step)

    def rmsnorm(self, x, w, y, rows, n, group=1, x_off=0, x_stride=0, x_inner=0, y_off=0,
                y_stride=0, y_inner=0, z=None, z_off=0, z_stride=0, z_inner=0, acc=False):
        """acc: y += the norm (a sandwich norm and its residual add)."""
        push = P.Rmsnorm(rows=rows, n=n, group=group, x_off=x_off, x_stride=x_stride, x_inner=x_inner,
                         y_off=y_off, y_stride=y_stride, y_inner=y_inner, z_off=z_off, z_stride=z_stride,
                         z_inner=z_inner, eps=self.cfg.rms_norm_eps, inv_n=np.float32(1.0 / n), w_off=w.off)
        if z is None:
            self.rec.op(G.RMSNORM, "acc" if acc else "plain", groups(rows), push, x=x, w=w.t, y=y)
        else:
            self.rec.op(G.RMSNORM_GATED, "gated", groups(rows), push, x=x, w=w.t, y=y, z=z)

    def bias_add(self, y, b, rows, n, y_off=0, y_stride=0, x=None, x_off=0, x_stride=0):
        """y += b row by row, or with x (the acc variant) y += x + b."""
        push = P.BiasAdd(rows=rows, n=n, x_off=x_off, x_stride=x_stride, y_off=y_off, y_stride=y_stride,
                         b_off=b.off)
        if x is None:
            self.rec.op(G.BIAS_ADD, "inplace", groups(rows * n), push, y=y, b=b.t)
        else:
            self.rec.op(G.BIAS_ADD_ACC, "acc", groups(rows * n), push, x=x, b=b.t, y=y)

    # --- a whole pass -------------------------------------------------------------
    def record(self, kind: Pass, n: int, bucket: int, last: bool, listed: int = 0):
        """The sequence of one shape: (segments, logits tensor, picks tensor)."""
        d, s, b = self.d, self.s, self.b
        self.rec = Recording(self.dev, self.algos)
        step = b.step if kind is Pass.MAIN else b.mtp_step
        x = s.x if kind is Pass.MAIN else s.mx
        trunk = self.lay.n_trunk
        if kind is Pass.MAIN:
            self.embed(x, n, step, self.cfg.embedding_scale)
            layers = b.layers[:trunk]
        else:
            F = padded(2 * d.H)
            self.embed(s.h, n, step)
            self.rmsnorm(s.h, b.norm_emb, s.fcin, n, d.H, x_stride=d.Hp, y_stride=F)
            self.rmsnorm(s.mtp_in, b.norm_hidden, s.fcin, n, d.H, x_stride=d.Hp, y_off=d.H, y_stride=F)
            self.gemv(b.fc, s.fcin, x, n, y_stride=d.Hp)
            layers = b.layers[trunk:]
        for L in layers:
            # the head absorbing a block: the rows before the last only write
            # their KV row (nothing else of theirs is ever read)
            self.layer(L, x, n, bucket, step, last_only=kind is Pass.MTP and last and L.attention)
        rows = 1 if last else n
        norm = b.norm if kind is Pass.MAIN else b.mtp_norm
        self.rmsnorm(x, norm, s.xn, rows, d.H, x_off=(n - rows) * d.Hp, x_stride=d.Hp, y_stride=d.Hp)
        logits, picks = self.lay.outputs(self.up, b, kind, rows)
        width = listed or d.V                # listed: the head scores its draft vocabulary
        self.gemv(b.head, s.xn, logits, rows, x_stride=d.Hp, row_of=b.ids if listed else None, out_rows=width)
        self.rec.op(G.ARGMAX, None, groups(rows), P.Argmax(rows=rows, n=width, x_stride=width),
                    x=logits, y=picks)
        first = [step] + ([s.mtp_in, b.mtp_last] if kind is Pass.MTP else [])
        segments = self.rec.sequences(first, [x, logits, picks] + ([s.ridx] if self.tier else []))
        self.rec = None
        return segments, logits, picks

    def layer(self, L: Layer, x, n, bucket, step, last_only=False):
        """The layer's graph (vkspec.layer_graph), step by step. A Norm writes
        h; each sublayer adds its output into x in its last op (the graph's
        check makes that the same add as its Add step's), so an Add records
        nothing. After a ``last_only`` mixer the steps work on the last row."""
        d, s = self.d, self.s
        rows, first, h_first = n, 0, None           # first: the x row the steps' row 0 is
        for st in L.graph.steps:
            if type(st) is Norm:
                self.rmsnorm(x, L.norms[st.weight], s.h, rows, d.H, x_off=first * d.Hp, x_stride=d.Hp,
                             y_stride=d.Hp)
                h_first = first
            elif type(st) is Sub:
                if h_first != first:
                    raise VkspecError(f"layer graph {L.graph.name!r}: the MTP head's last row needs a Norm "
                                      "after its mixer")
                norm = L.graph.add_of(st.kind).norm
                out_norm = None if norm is None else L.norms[norm]
                if st.kind is Sublayer.FFN:
                    (self.moe if L.ffn.moe_i >= 0 else self.mlp)(L, x, rows, first * d.Hp, out_norm)
                elif L.attention:
                    self.attention(L, x, n, bucket, step, last_only, out_norm)
                    rows, first = (1, n - 1) if last_only else (n, 0)
                else:
                    self.deltanet(L, x, n, step, out_norm)

    def attention(self, L: Layer, x, n, bucket, step, last_only=False, out_norm=None):
        """``last_only`` (the MTP head absorbing a block): every row writes
        its K/V row; only the last is attended and goes on (into its x row),
        with positions from the one-row ``mtp_last`` step."""
        d, s, a = self.d, self.s, L.mixer
        nh, nkv, hd, qw = d.nh, d.nkv, d.hd, d.qw
        Pw = L.mix.rows
        self.gemv(L.mix, s.h, s.proj, n, x_stride=d.Hp)
        if a.bias is not None:
            self.bias_add(s.proj, a.bias, n, Pw, y_stride=Pw)
        if a.q_norm is not None:
            self.rmsnorm(s.proj, a.q_norm, s.qn, n * nh, hd, group=nh, x_stride=Pw,
                         x_inner=qw, y_stride=nh * hd, y_inner=hd)
            self.rmsnorm(s.proj, a.k_norm, s.kn, n * nkv, hd, group=nkv, x_off=nh * qw,
                         x_stride=Pw, x_inner=hd, y_stride=nkv * hd, y_inner=hd)
            q_src = (s.qn, 0, nh * hd, hd)               # (tensor, offset, row stride, head stride)
            k_src = (s.kn, 0, nkv * hd, hd)
        else:
            q_src = (s.proj, 0, Pw, qw)
            k_src = (s.proj, nh * qw, Pw, hd)
        rot = self.cfg.rotary_dim

        def rope(src, dst, variant, heads, r, y_stride, rows=n, at=step, y_off=0):
            t, off, stride, hstride = src
            self.rec.op(G.ROPE, variant, groups(rows * heads * hd),
                        P.Rope(rows=rows, heads=heads, hd=hd, rot=r, x_off=off, x_stride=stride,
                               x_hstride=hstride, y_off=y_off, y_stride=y_stride),
                        x=t, cos=a.cos, sin=a.sin, y=dst, step=at)

        rope(k_src, a.kc.t, "cache", nkv, rot, nkv * hd, y_off=a.kc.off)
        rope((s.proj, nh * qw + nkv * hd, Pw, hd), a.vc.t, "cache", nkv, 0, nkv * hd, y_off=a.vc.off)
        first = n - 1 if last_only else 0            # the first row attended
        if last_only:
            n, step = 1, self.b.mtp_last
        t, off, stride, hstride = q_src
        rope((t, off + first * stride, stride, hstride), s.qr, "rows", nh, rot, nh * hd, rows=n, at=step)
        common = dict(rows=n, heads=nh, kv_heads=nkv, hd=hd, s_stride=self.lay.ctx,
                      scale=np.float32(self.cfg.scores_scale), window=a.window)
        self.rec.op(G.ATTEND, "scores", (groups(bucket), n * nh),
                    P.Attend(q_stride=nh * hd, q_hstride=hd, kv_off=a.kc.off, **common),
                    q=s.qr, kv=a.kc.t, s=s.scores, o=s.attn_o, step=step)
        self.rec.op(G.ATTEND, "softmax", (1, n * nh), P.Attend(**common),
                    q=s.qr, kv=a.kc.t, s=s.scores, o=s.attn_o, step=step)
        self.rec.op(G.ATTEND, "out_gated" if a.gated else "out", (groups(hd), n * nh),
                    P.Attend(q_stride=Pw, q_hstride=qw, gate_off=first * Pw + hd, o_stride=padded(nh * hd),
                             kv_off=a.vc.off, **common),
                    q=s.proj, kv=a.vc.t, s=s.scores, o=s.attn_o, step=step)
        self.out(L.out, out_norm, s.attn_o, padded(nh * hd), x, n, first * d.Hp, a.o_bias)

    def out(self, w: DevWeight, norm, src, src_stride, x, n, x_off, bias=None):
        """x rows (from float x_off) += w src + bias (a sublayer's output
        projection); with a sandwich norm, x += norm(w src + bias). The
        additions in the CPU's order: the bias before the residual."""
        d, s = self.d, self.s
        if norm is None and bias is None:
            self.gemv(w, src, x, n, x_stride=src_stride, y_off=x_off, y_stride=d.Hp, acc=True)
        elif norm is None:
            self.gemv(w, src, s.sh, n, x_stride=src_stride, y_stride=d.H)
            self.bias_add(x, bias, n, d.H, y_off=x_off, y_stride=d.Hp, x=s.sh, x_stride=d.H)
        else:
            self.gemv(w, src, s.sub, n, x_stride=src_stride, y_off=x_off, y_stride=d.Hp)
            if bias is not None:
                self.bias_add(s.sub, bias, n, d.H, y_off=x_off, y_stride=d.Hp)
            self.rmsnorm(s.sub, norm, x, n, d.H, x_off=x_off, x_stride=d.Hp, y_off=x_off, y_stride=d.Hp,
                         acc=True)

    def deltanet(self, L: Layer, x, n, step, out_norm=None):
        d, s, m = self.d, self.s, L.mixer
        Pw = L.mix.rows
        self.gemv(L.mix, s.h, s.proj, n, x_stride=d.Hp)
        self.rec.op(G.CONV_STEP, None, groups(d.cd),
                    P.ConvStep(rows=n, channels=d.cd, k=d.K, x_stride=Pw, y_stride=d.cd,
                               w_off=m.conv_w.off, r_off=m.ring.off),
                    x=s.proj, w=m.conv_w.t, ring=m.ring.t, y=s.mixed, step=step)
        push = P.Deltanet(rows=n, nk=d.nk, nv=d.nv, dk=d.dk, dv=d.dv, m_stride=d.cd,
                              ba_off=d.cd + d.nv * d.dv, ba_stride=Pw, o_stride=d.nv * d.dv,
                              scale=np.float32(d.dk ** -0.5), eps=np.float32(1e-6), p_off=m.par.off,
                              s_off=m.ssm.off, tiled=d.tiled)
        buffers = dict(mixed=s.mixed, ba=s.proj, par=m.par.t, prep=s.prep, state=m.ssm.t, o=s.dn_o, step=step)
        self.rec.op(G.DELTANET, "prep", groups(n * (2 * d.nk + d.nv)), push, **buffers)
        self.rec.op(G.DELTANET, "scan", groups(d.nv * d.dv), push, **buffers)
        self.rmsnorm(s.dn_o, m.norm, s.dn_n, n * d.nv, d.dv, group=d.nv, x_stride=d.nv * d.dv,
                     x_inner=d.dv, y_stride=padded(d.nv * d.dv), y_inner=d.dv, z=s.proj, z_off=d.cd,
                     z_stride=Pw, z_inner=d.dv)
        self.out(L.out, out_norm, s.dn_n, padded(d.nv * d.dv), x, n, 0)

    def act_mul(self, x, y, rows, n, x_stride, y_stride, act="silu"):
        """act(g) * u: silu_mul.comp, or gelu_mul.comp for act "gelu_tanh"."""
        op, push = (G.GELU_MUL, P.GeluMul) if act == "gelu_tanh" else (G.SILU_MUL, P.SiluMul)
        self.rec.op(op, None, groups(rows * n), push(rows=rows, n=n, x_stride=x_stride, y_stride=y_stride),
                    x=x, y=y)

    def mlp(self, L: Layer, x, n, x_off=0, out_norm=None):
        """h rows 0..n-1 -> added to x from float x_off (normed by out_norm first, when given)."""
        d, s, f = self.d, self.s, L.ffn
        inter, width = padded(f.down.cols), f.gate_up.rows // 2
        self.gemv(f.gate_up, s.h, s.proj, n, x_stride=d.Hp)
        self.act_mul(s.proj, s.act, n, width, 2 * width, inter, self.cfg.hidden_act)
        self.out(f.down, out_norm, s.act, inter, x, n, x_off)

    def moe(self, L: Layer, x, n, x_off=0, out_norm=None):
        if out_norm is not None:
            raise VkspecError(f"layer graph {L.graph.name!r}: no output norm on the experts' combine")
        d, s, f = self.d, self.s, L.ffn
        E, k, H, mi = d.E, d.k, d.H, self.cfg.moe_intermediate_size
        R = f.router.rows
        off = f.moe_i * MAX_ROWS * k                # this layer's rows of the routing buffers
        self.gemv(f.router, s.h, s.rlog, n, x_stride=d.Hp)
        self.rec.op(G.ROUTE, None, groups(n),
                    P.Route(rows=n, n=E, k=k, x_stride=R, normalize=int(self.cfg.norm_topk_prob), y_off=off),
                    logits=s.rlog, idx=s.ridx, wt=s.rwt)
        if self.tier is not None and self.tier.holds_layer(f):
            # the host computes (or streams in) the pairs whose expert has no slot
            self.rec.sync_local([s.h, s.ridx])
            self.rec.host(self.tier.host_step(f, n))
            self.rec.sync_device([s.ed, f.smap])
        self.routed(f.gate_up, s.h, s.ey, n * k, k, d.Hp, 2 * mi, 2 * mi, f.smap, off)
        self.act_mul(s.ey, s.act, n * k, mi, 2 * mi, padded(mi))
        self.routed(f.down, s.act, s.ed, n * k, 1, padded(mi), H, H, f.smap, off)
        shared = f.sh_down is not None
        if shared:
            si, w2 = padded(f.sh_down.cols), f.sh_gate_up.rows // 2
            self.gemv(f.sh_gate_up, s.h, s.proj, n, x_stride=d.Hp)
            self.act_mul(s.proj, s.act, n, w2, 2 * w2, si, self.cfg.hidden_act)
            self.gemv(f.sh_down, s.act, s.sh, n, x_stride=si, y_stride=H)
        self.rec.op(G.MOE_COMBINE, "shared" if shared else "routed", groups(n * H),
                    P.MoeCombine(rows=n, n=H, k=k, x_off=x_off, x_stride=d.Hp, y_stride=H, s_stride=H,
                                 g_stride=R, g_off=E, w_off=off),
                    x=x, y=s.ed, wt=s.rwt, sh=s.sh, gate=s.rlog)
