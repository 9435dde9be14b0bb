"""What the dense chain holds on the device: the weights as the chain reads
them, the state and working buffers, each under a name (the memory plan).

Terms:
* **fused weight**: projections of one input whose rows follow one another on
  the device (q|k|v, qkvz|ba, gate|up, router|shared gate), so one GEMV per
  format computes them all: each output row keeps its bits. The host keeps
  the parts as they are (views of the file); they meet only on the device.
* **region**: the recurrent state (conv ring, DeltaNet state) of every layer
  is a buffer of R >= 2 regions (see state.py); ``regions`` sizes them.
* **scratch**: the activations of a block of up to MAX_ROWS rows.
* **outputs**: the logits and device picks of the trunk (one pair for every row count) and of the head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ... import exact
from ...config import ModelConfig
from ...formats.matrix import QWeight
from ...layer_graph import LayerGraph
from ...rope import rope_tables
from ...shaders.limits import MAX_ROWS  # one definition, compiled into the shaders
from ...weights import LayerW, MoeW, Weights, qweights
from .buffers import DevWeight, Span, q8_words
from .graph import Pass
from .memory import Uploader
from .step import step_block

if TYPE_CHECKING:
    import kp

P = exact.padded


@dataclass(frozen=True)
class Dims:
    H: int          # hidden size
    Hp: int         # hidden size padded for the reductions
    V: int          # vocabulary
    nh: int         # attention heads, kv heads, head size, q projection width per head
    nkv: int
    hd: int
    qw: int
    nk: int         # DeltaNet key heads, value heads, key and value head sizes, conv taps
    nv: int
    dk: int
    dv: int
    K: int
    cd: int         # DeltaNet conv channels (q|k|v)
    E: int          # routed experts and experts per token
    k: int
    tiled: int = 0  # value head h reads key head h % nk (ModelConfig.linear_v_tiled)

    @classmethod
    def of(cls, c: ModelConfig) -> "Dims":
        nk, nv, dk, dv = (c.linear_num_key_heads, c.linear_num_value_heads,
                          c.linear_key_head_dim, c.linear_value_head_dim)
        return cls(H=c.hidden_size, Hp=P(c.hidden_size), V=c.vocab_size, nh=c.num_attention_heads,
                   nkv=c.num_key_value_heads, hd=c.head_dim,
                   qw=c.head_dim * (2 if c.attn_gate else 1),
                   nk=nk, nv=nv, dk=dk, dv=dv, K=c.linear_conv_kernel_dim, cd=2 * nk * dk + nv * dv,
                   E=c.num_experts, k=max(c.num_experts_per_tok, 1), tiled=int(c.linear_v_tiled))


# --- the host's view: the parts of each fused weight -------------------------------

@dataclass
class HostFfn:
    gate_up: list[QWeight]           # MoE: every expert's gate, up, expert after expert
    down: list[QWeight]
    router: list[QWeight] | None = None   # MoE: router, shared expert's gate
    sh_gate_up: list[QWeight] | None = None
    sh_down: list[QWeight] | None = None

    def parts(self) -> dict[str, list[QWeight]]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class HostLayer:
    w: LayerW
    mix: list[QWeight]
    out: list[QWeight]
    ffn: HostFfn

    @property
    def moe(self) -> bool:
        return isinstance(self.w.ffn, MoeW)


def rows(parts: list[QWeight]) -> int:
    return sum(p.rows for p in parts)


def fuse(lw: LayerW) -> HostLayer:
    m = lw.mixer
    mix = [m.q, m.k, m.v] if lw.kind == "full_attention" else list(m.proj)
    out = [m.o if lw.kind == "full_attention" else m.out]
    f = lw.ffn
    if isinstance(f, MoeW):
        ffn = HostFfn(gate_up=[q for e in f.experts for q in (e.gate, e.up)],
                      down=[e.down for e in f.experts],
                      router=[f.router] + ([f.shared_gate] if f.shared else []))
        if f.shared:
            ffn.sh_gate_up, ffn.sh_down = [f.shared.gate, f.shared.up], [f.shared.down]
    else:
        ffn = HostFfn(gate_up=[f.gate, f.up], down=[f.down])
    return HostLayer(lw, mix, out, ffn)


# --- the device's view ------------------------------------------------------------

@dataclass
class Ffn:
    gate_up: DevWeight | None = None
    down: DevWeight | None = None
    router: DevWeight | None = None
    sh_gate_up: DevWeight | None = None
    sh_down: DevWeight | None = None
    moe_i: int = -1                # MoE ordinal: this layer's rows of the routing buffers
    smap: kp.Tensor | None = None  # expert -> device slot (the tier edits it)
    tier_ord: int | None = None    # the tier's ordinal, when the tier holds this layer's experts


@dataclass
class AttnMixer:
    gated: bool
    q_norm: Span | None
    k_norm: Span | None
    kc: Span                      # KV cache, (ctx, nkv, hd) each
    vc: Span
    bias: Span | None = None      # the fused q|k|v rows' biases
    o_bias: Span | None = None
    cos: kp.Tensor | None = None  # this layer's RoPE tables (one pair per base, shared)
    sin: kp.Tensor | None = None
    window: int = 0               # keys at distance 0..window-1 (0: all)


@dataclass
class DeltaMixer:
    conv_w: Span
    par: Span   # dt_bias | -exp(A_log)
    norm: Span
    ring: Span  # (regions, K-1, cd)
    ssm: Span   # (regions, nv, dk, dv)


@dataclass
class Layer:
    index: int
    graph: LayerGraph           # the steps the recorder records (vkspec.layer_graph)
    norms: dict[str, Span]      # the graph's norms by name
    mix: DevWeight
    out: DevWeight
    mixer: AttnMixer | DeltaMixer
    ffn: Ffn

    @property
    def attention(self) -> bool:
        return isinstance(self.mixer, AttnMixer)


@dataclass
class Scratch:
    """A block's activations; names as in the recorder. x, mx, mtp_in, h, ed
    and ridx are host-visible: the host reads or writes them between passes."""
    x: kp.Tensor       # the trunk's residual stream
    h: kp.Tensor       # normed rows
    xn: kp.Tensor      # the final norm's rows
    proj: kp.Tensor    # a fused projection's output
    qn: kp.Tensor      # q and k after their norms, q after RoPE
    kn: kp.Tensor
    qr: kp.Tensor
    scores: kp.Tensor
    attn_o: kp.Tensor
    mixed: kp.Tensor   # the conv's output
    prep: kp.Tensor    # q, k, beta, decay of the delta rule
    dn_o: kp.Tensor
    dn_n: kp.Tensor
    act: kp.Tensor     # silu(g) * u
    rlog: kp.Tensor    # router logits (and the shared gate)
    ridx: kp.Tensor    # routed experts and their weights, per MoE layer
    rwt: kp.Tensor
    ey: kp.Tensor      # routed gate|up, then routed down outputs
    ed: kp.Tensor
    sh: kp.Tensor      # the shared expert's output
    fcin: kp.Tensor    # the MTP head's fc input
    mx: kp.Tensor      # the MTP head's residual stream
    mtp_in: kp.Tensor  # the trunk's hidden rows the head reads
    sub: kp.Tensor     # a sublayer's output before its sandwich norm (Gemma 3)
    q8: kp.Tensor      # a GEMV's input as q8 blocks (quantize_q8.comp): a region per block size


HOST_VISIBLE = ("x", "mx", "mtp_in", "h", "ed", "ridx")


@dataclass
class Buffers:
    embed: DevWeight
    head: DevWeight
    cos: kp.Tensor
    sin: kp.Tensor
    norm: Span
    layers: list[Layer]
    scratch: Scratch
    step: kp.Tensor                  # the Step block (shaders/step.glsl) of a trunk pass
    mtp_step: kp.Tensor              # ... of a head pass
    mtp_last: kp.Tensor              # ... of a head pass's last row alone
    fc: DevWeight | None = None      # the MTP head
    norm_emb: Span | None = None
    norm_hidden: Span | None = None
    mtp_norm: Span | None = None
    ids: kp.Tensor | None = None     # the head's draft vocabulary
    outputs: dict = field(default_factory=dict)   # (pass, rows) -> (logits, picks)


class Layout:
    """The chain of one model: what it holds, decided without a device."""

    def __init__(self, cfg: ModelConfig, w: Weights, ctx: int):
        self.cfg, self.w, self.ctx = cfg, w, ctx
        self.n_trunk, self.mtp = len(w.layers), w.mtp is not None
        self.dims = Dims.of(cfg)
        self.layers_w = w.layers + ([w.mtp.layer] if w.mtp else [])
        self.host = [fuse(lw) for lw in self.layers_w]
        self.n_moe = max(1, sum(h.moe for h in self.host))
        # words of one block size's region of the q8 scratch: the most input
        # rows of a q8 GEMV (a routed one's: a row per expert pair) at the
        # widest q8 input, counted at 32-column blocks (more words than 256)
        cols = [q.cols for q in qweights(w) if q.acts == "q8"]
        self.q8_region = MAX_ROWS * max(self.dims.k, 1) * q8_words(max(cols), 32) if cols else 4

    def output_shapes(self):
        return [(Pass.MAIN, MAX_ROWS)] + ([(Pass.MTP, 1)] if self.mtp else [])

    def scratch_words(self) -> dict[str, int]:
        d, R = self.dims, MAX_ROWS
        proj = [rows(h.mix) for h in self.host]
        proj += [rows(h.ffn.sh_gate_up) for h in self.host if h.ffn.sh_gate_up is not None]
        proj += [rows(h.ffn.gate_up) for h in self.host if not h.moe]
        inter = [P(q[0].cols) for h in self.host for q in (h.ffn.down, h.ffn.sh_down) if q is not None]
        proj, inter = max(proj + [1]), max(inter + [1])
        return dict(
            x=R * d.Hp, h=R * d.Hp, xn=R * d.Hp, proj=R * proj,
            qn=R * d.nh * d.hd, kn=R * d.nkv * d.hd, qr=R * d.nh * d.hd,
            scores=R * d.nh * self.ctx, attn_o=R * P(d.nh * d.hd),
            mixed=R * d.cd, prep=R * (2 * d.nk * d.dk + 2 * d.nv),
            dn_o=R * d.nv * d.dv, dn_n=R * P(max(d.nv * d.dv, 1)),
            act=R * d.k * inter, rlog=R * (d.E + 1), ridx=R * d.k * self.n_moe,
            rwt=R * d.k * self.n_moe,
            ey=R * d.k * 2 * max(self.cfg.moe_intermediate_size, 1), ed=R * d.k * d.H,
            sh=R * d.H, fcin=R * P(2 * d.H), mx=R * d.Hp, mtp_in=R * d.Hp,
            sub=R * d.Hp if self.cfg.sandwich_norms else 1,
            q8=2 * self.q8_region)

    def release_host(self):
        """After the upload the device holds every weight: the host lets go of
        its views of the file, so the mapped pages leave the process (on a
        shared-memory GPU the weights then live once). The expert tier keeps
        what it reads on the CPU (tier/resident.py)."""
        self.w = self.host = None

    def allocate(self, up: Uploader, regions: int = 2, tier=None) -> Buffers:
        """Make every tensor through `up` (a dry uploader: the plan); the
        recurrent state gets `regions` regions; `tier` (an ExpertTier) makes
        the slots of the experts it holds instead of whole expert weights."""
        d, words = self.dims, step_block().words
        cos, sin = rope_tables(self.cfg, self.ctx)
        zero = np.zeros(1, np.float32)
        embed = up.weight("weights:embed", [self.w.embed], arena=False)
        tied = self.w.lm_head is self.w.embed          # one tensor in the file: one on the device
        b = Buffers(embed=embed, head=embed if tied else up.weight("weights:lm_head", [self.w.lm_head],
                                                                   arena=False),
                    cos=up.array("rope:cos", cos if cos.size else zero),
                    sin=up.array("rope:sin", sin if sin.size else zero),
                    norm=up.vector("weights:norm", self.w.norm), layers=[],
                    scratch=Scratch(**{name: up.zeros(f"scratch:{name}", words,
                                                      np.uint32 if name in ("ridx", "q8") else np.float32,
                                                      "device" if name in HOST_VISIBLE else "storage")
                                       for name, words in self.scratch_words().items()}),
                    step=up.zeros("scratch:step", words, np.uint32, "device"),
                    mtp_step=up.zeros("scratch:mtp_step", words, np.uint32, "device"),
                    mtp_last=up.zeros("scratch:mtp_last", words, np.uint32, "device"))
        self.ropes = {None: (b.cos, b.sin)}     # one table pair per RoPE base
        for lw in self.layers_w:
            theta = getattr(lw.mixer, "rope_theta", None)
            if theta not in self.ropes:
                c, s_ = rope_tables(self.cfg, self.ctx, theta)
                self.ropes[theta] = (up.array(f"rope:cos@{theta:g}", c), up.array(f"rope:sin@{theta:g}", s_))
        if self.w.mtp:
            m = self.w.mtp
            b.fc = up.weight("weights:mtp.fc", [m.fc])
            b.norm_emb = up.vector("weights:mtp.norm_emb", m.norm_emb)
            b.norm_hidden = up.vector("weights:mtp.norm_hidden", m.norm_hidden)
            b.mtp_norm = up.vector("weights:mtp.norm", m.norm)
            b.ids = up.zeros("scratch:mtp_ids", d.V, np.uint32, "device")
        moe_i = 0
        for i, host in enumerate(self.host):
            b.layers.append(self._layer(up, i, host, regions, moe_i, tier))
            moe_i += host.moe
        for kind, rows in self.output_shapes():
            self.outputs(up, b, kind, rows)
        return b

    def outputs(self, up: Uploader, b: Buffers, kind: Pass, rows: int):
        """The (logits, picks) tensors of a pass of `rows` rows. Every trunk
        pass shares one pair of MAX_ROWS rows (a pass's rows are copied out
        before the next pass runs; one pair per row count cost 4.5x the
        memory, and a host-visible buffer counts twice where device memory is
        host memory). The head's are made on first use beyond the planned
        shapes (its whole-block passes: tests)."""
        rows = MAX_ROWS if kind is Pass.MAIN else rows
        if (kind, rows) not in b.outputs:
            V = self.dims.V
            b.outputs[kind, rows] = (up.zeros(f"outputs:{kind}{rows}.logits", rows * V, np.float32, "device"),
                                     up.zeros(f"outputs:{kind}{rows}.picks", rows, np.uint32, "device"))
        return b.outputs[kind, rows]

    def _layer(self, up, i, host: HostLayer, regions, moe_i, tier) -> Layer:
        d, lw, p = self.dims, host.w, f"layer{i}"
        ffn = Ffn()
        for name, q in host.ffn.parts().items():
            if tier is None or not tier.holds(i, name):
                setattr(ffn, name, up.weight(f"weights:{p}.{name}", q))
        if host.moe:
            ffn.moe_i = moe_i
            ffn.smap = up.array(f"scratch:{p}.slot_map", np.arange(d.E, dtype=np.uint32), "device")
            if tier is not None and tier.holds(i, "gate_up"):
                tier.build_layer(up, i, ffn)
        m = lw.mixer
        if lw.kind == "full_attention":
            n = self.ctx * d.nkv * d.hd

            def vec(name, a):
                return None if a is None else up.vector(f"weights:{p}.{name}", a)
            mixer = AttnMixer(m.gated, vec("q_norm", m.q_norm), vec("k_norm", m.k_norm),
                              up.span(f"kv:{p}.k", n, "kv"), up.span(f"kv:{p}.v", n, "kv"),
                              vec("qkv_bias", m.qkv_bias), vec("o_bias", m.o_bias),
                              *self.ropes[m.rope_theta], window=m.window)
        else:
            mixer = DeltaMixer(up.vector(f"weights:{p}.conv", m.conv),
                               up.vector(f"weights:{p}.dt_bias_a", np.concatenate([m.dt_bias, m.neg_exp_a])),
                               up.vector(f"weights:{p}.norm", m.norm),
                               up.span(f"state:{p}.conv", regions * (d.K - 1) * d.cd, "ring"),
                               up.span(f"state:{p}.ssm", regions * d.nv * d.dk * d.dv, "ssm"))
        norms = {k: up.vector(f"weights:{p}.{k}", w) for k, w in lw.norms.items()}
        return Layer(i, lw.graph, norms, up.weight(f"weights:{p}.mix", host.mix),
                     up.weight(f"weights:{p}.out", host.out), mixer, ffn)

