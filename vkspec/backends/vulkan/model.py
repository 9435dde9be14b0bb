"""The Vulkan dense chain: the whole model on the device, byte for byte with
the NumPy path (vkspec.model), behind the same interface.

Terms:
* **block**: n <= MAX_ROWS consecutive tokens fed in one forward (a decode
  step is a block of 1, a verify is a block of k+1, prefill goes in blocks of
  MAX_ROWS). Every row gets the bits it would get alone.
* **sequence**: the kp sequence recorded once per step shape (kind, rows,
  attention bucket, logits rows) and replayed: one ``eval()`` per forward,
  no Python per op. Push constants are fixed at record time; what changes per
  step goes through the step buffer (shaders/step.glsl).
* **watermark**: ``kv_len``, the rows of the device KV cache that are valid.
  Rewinding lowers it; the next forward overwrites the stale tail.
* **region**: the recurrent state (conv ring, DeltaNet state) of every layer
  is a buffer of R >= 2 regions. A block reads the live region and never
  writes it: the state after its last row goes to another region, which
  becomes live, so the state before the block stays restorable until the next
  forward. With copies, the state after row r is also written to a region of
  its own, the **copy slot** of row r. Rewinding makes a slot (or the region
  that was live before the block) live again: a swap of roles, nothing moves.
  Regions beyond two are allocated on first use.
"""

from __future__ import annotations

import time

import numpy as np

from ... import exact
from ...config import ModelConfig
from ...errors import VkspecError
from ...formats.quant import as_bf16
from ...interface import HostState as State
from ...rope import rope_tables
from ...weights import MlpW, MoeW, Weights
from .device import get_device, load_shader
from .memory import DevWeight, Plan, Uploader, budget_bytes, qcat

MAX_ROWS = 8
LISTED_STEP = 256          # a draft vocabulary's device list grows in steps of this many ids
NO_SLOT = 0xFFFFFFFF
# the Step block of shaders/step.glsl, in uint32 words
STEP_KV_LEN, STEP_LIVE, STEP_NROWS = 0, 1, 2
STEP_SLOT, STEP_TOK, STEP_POS = 4, 4 + MAX_ROWS, 4 + 2 * MAX_ROWS
STEP_WORDS = 4 + 3 * MAX_ROWS

P = exact.padded


def _groups(n: int, local: int = 64) -> int:
    return max(1, -(-n // local))


class DeviceState:
    """Where a sequence of forwards stands on the device (the host's half)."""

    def __init__(self, model: "VulkanModel"):
        self.model = model
        self.kv_len = 0
        self.mtp_len = 0
        self.live = 0
        # the last block: (kv_len before, rows, region live before, region per row or None)
        self.block: tuple[int, int, int, list] | None = None


class VulkanModel:
    """The dense chain for one model. Same interface as vkspec.model.Model:
    new_state, forward, mtp_forward, rewind (and read_state for tests)."""
    max_rows = MAX_ROWS
    backend = "vulkan"
    listed_step = LISTED_STEP

    def __init__(self, cfg: ModelConfig, w: Weights, ctx: int | None = None,
                 budget_gb: float | None = None, tier=None):
        self._setup(cfg, w, ctx, tier)
        self.plan = self.memory_plan()
        self.plan.check(budget_bytes(budget_gb))
        self.dev = get_device()
        self.kp = self.dev.kp
        self.up = Uploader(self.dev)
        self._algos: dict = {}
        self._seqs: dict = {}
        self.recordings = 0        # sequences recorded so far (a forward that records is slow)
        self._state: DeviceState | None = None
        self.timing: dict | None = None
        self._build()

    def _setup(self, cfg, w, ctx, tier):
        """What the chain will hold, decided without touching the device."""
        from ...tier.resident import ExpertTier
        self.cfg, self.w = cfg, w
        self.ctx = ctx or min(cfg.max_position_embeddings, 4096)
        self.fused = self._fused()
        self.head_w = as_bf16(w.lm_head)
        self.fc_w = as_bf16(w.mtp.fc) if w.mtp else None
        self.tier = ExpertTier(self, tier) if tier is not None else None

    @classmethod
    def planned(cls, cfg, w, ctx=None, tier=None, slots: int = 0) -> Plan:
        """The memory plan of a chain with `slots` recurrent copy slots, without a device."""
        self = cls.__new__(cls)
        self._setup(cfg, w, ctx, tier)
        return self.memory_plan(slots)

    @property
    def has_mtp(self) -> bool:
        return self.w.mtp is not None

    # --- memory ---------------------------------------------------------------
    def _fused(self):
        """The weights as the chain reads them: projections of one input fused,
        bf16 where every value is one (quant.as_bf16)."""
        w = self.w
        layers = []
        for lw in w.layers + ([w.mtp.layer] if w.mtp else []):
            m = lw.mixer
            mix = qcat([m.q, m.k, m.v]) if lw.kind == "full_attention" else qcat([m.qkvz, m.ba])
            out = m.o if lw.kind == "full_attention" else m.out
            if isinstance(lw.ffn, MoeW):
                f = lw.ffn
                ffn = dict(router=qcat([f.router] + ([f.shared_gate] if f.shared else [])),
                           gate_up=qcat([qcat([e.gate, e.up]) for e in f.experts]),
                           down=qcat([e.down for e in f.experts]))
                if f.shared:
                    ffn.update(sh_gate_up=qcat([f.shared.gate, f.shared.up]), sh_down=f.shared.down)
            else:
                ffn = dict(gate_up=qcat([lw.ffn.gate, lw.ffn.up]), down=lw.ffn.down)
            layers.append((as_bf16(mix), as_bf16(out), {k: as_bf16(q) for k, q in ffn.items()}))
        return layers

    def _dims(self):
        c = self.cfg
        H = c.hidden_size
        d = dict(H=H, Hp=P(H), V=c.vocab_size, nh=c.num_attention_heads, nkv=c.num_key_value_heads,
                 hd=c.head_dim, qw=c.head_dim * (2 if c.model_type == "qwen3_next" else 1),
                 nk=c.linear_num_key_heads, nv=c.linear_num_value_heads,
                 dk=c.linear_key_head_dim, dv=c.linear_value_head_dim, K=c.linear_conv_kernel_dim,
                 E=c.num_experts, k=max(c.num_experts_per_tok, 1))
        d["cd"] = 2 * d["nk"] * d["dk"] + d["nv"] * d["dv"]
        return d

    def memory_plan(self, slots: int = 0) -> Plan:
        """Every tensor the chain makes, by name; `slots` copy slots beyond the two
        regions every recurrent state has."""
        d, c, ctx = self._dims(), self.cfg, self.ctx
        regions = 2 + slots
        items = []

        def wt(name, q):
            items.append((f"weights:{name}", int(q.data.nbytes)))
            items.append((f"weights:{name}.scales", int(max(q.scales.nbytes, 4))))

        items.append(("weights:embed", self.w.embed.nbytes))
        for i, lw in enumerate(self._layers_w()):
            norms = [lw.in_norm, lw.post_norm]
            m = lw.mixer
            if lw.kind == "full_attention":
                norms += [m.q_norm, m.k_norm] if m.q_norm is not None else []
            else:
                norms += [m.conv, m.norm, np.concatenate([m.dt_bias, m.neg_exp_a])]
            items += [(f"weights:layer{i}.vectors", sum(int(a.nbytes) for a in norms))]
        vectors = [self.w.norm] + ([self.w.mtp.norm_emb, self.w.mtp.norm_hidden, self.w.mtp.norm]
                                   if self.w.mtp else [])
        items.append(("weights:norms", sum(int(a.nbytes) for a in vectors)))
        wt("lm_head", self.head_w)
        if self.w.mtp:
            wt("mtp.fc", self.fc_w)
        n_attn = 0
        for i, (mix, out, ffn) in enumerate(self.fused):
            wt(f"layer{i}.mix", mix)
            wt(f"layer{i}.out", out)
            for k, q in ffn.items():
                if self.tier is not None and self.tier.holds(i, k):
                    items += self.tier.plan_items(i, k)
                else:
                    wt(f"layer{i}.{k}", q)
            kind = self._layers_w()[i].kind
            if kind == "full_attention":
                n_attn += 1
                items += [(f"kv:layer{i}.{t}", ctx * d["nkv"] * d["hd"] * 4) for t in "kv"]
            else:
                items += [(f"state:layer{i}.conv", regions * (d["K"] - 1) * d["cd"] * 4),
                          (f"state:layer{i}.ssm", regions * d["nv"] * d["dk"] * d["dv"] * 4)]
        items += [("rope:cos", ctx * max(c.rotary_dim, 1) * 4), ("rope:sin", ctx * max(c.rotary_dim, 1) * 4)]
        for name, words in self._scratch_sizes().items():
            items.append((f"scratch:{name}", words * 4))
        items += [("scratch:step", STEP_WORDS * 4), ("scratch:mtp_step", STEP_WORDS * 4),
                  ("scratch:mtp_last", STEP_WORDS * 4)]
        if self.w.mtp:
            items.append(("scratch:mtp_ids", d["V"] * 4))
        for kind, rows in self._output_shapes():
            items += [(f"outputs:{kind}{rows}.logits", rows * d["V"] * 4), (f"outputs:{kind}{rows}.picks", rows * 4)]
        for L, lw in zip(range(len(self.fused)), self._layers_w()):
            if isinstance(lw.ffn, MoeW):
                items.append((f"scratch:layer{L}.slot_map", d["E"] * 4))
        if self.tier is not None:
            items += self.tier.staging_items()
        return Plan(items)

    def _output_shapes(self):
        return [("main", r) for r in range(1, MAX_ROWS + 1)] + ([("mtp", 1)] if self.w.mtp else [])

    def _layers_w(self):
        return self.w.layers + ([self.w.mtp.layer] if self.w.mtp else [])

    def _scratch_sizes(self) -> dict[str, int]:
        d, R = self._dims(), MAX_ROWS
        proj = [mix.rows for mix, _, _ in self.fused]
        proj += [f[k].rows for _, _, f in self.fused for k in ("sh_gate_up",) if k in f]
        proj += [f["gate_up"].rows for _, _, f in self.fused if "router" not in f]
        inter = [f[k].cols_p for _, _, f in self.fused for k in ("down", "sh_down") if k in f]
        proj, inter = max(proj + [1]), max(inter + [1])
        return dict(
            x=R * d["Hp"], h=R * d["Hp"], xn=R * d["Hp"], proj=R * proj,
            qn=R * d["nh"] * d["hd"], kn=R * d["nkv"] * d["hd"], qr=R * d["nh"] * d["hd"],
            scores=R * d["nh"] * self.ctx, attn_o=R * P(d["nh"] * d["hd"]),
            mixed=R * d["cd"], prep=R * (2 * d["nk"] * d["dk"] + 2 * d["nv"]),
            dn_o=R * d["nv"] * d["dv"], dn_n=R * P(max(d["nv"] * d["dv"], 1)),
            act=R * d["k"] * inter, rlog=R * (d["E"] + 1), ridx=R * d["k"] * self._n_moe(),
            rwt=R * d["k"] * self._n_moe(),
            ey=R * d["k"] * 2 * max(self.cfg.moe_intermediate_size, 1), ed=R * d["k"] * d["H"],
            sh=R * d["H"], fcin=R * P(2 * d["H"]), mx=R * d["Hp"], mtp_in=R * d["Hp"])

    # --- building ---------------------------------------------------------------
    def _build(self):
        up, d = self.up, self._dims()
        self.t_embed = up.array(self.w.embed)
        self.t_head = up.weight(self.head_w)
        cos, sin = rope_tables(self.cfg, self.ctx)
        self.t_cos = up.array(cos if cos.size else np.zeros(1, np.float32))
        self.t_sin = up.array(sin if sin.size else np.zeros(1, np.float32))
        self.layers = []
        moe_i = 0
        for i, (lw, (mix, out, ffn)) in enumerate(zip(self._layers_w(), self.fused)):
            L = dict(kind=lw.kind, in_norm=up.array(lw.in_norm), post_norm=up.array(lw.post_norm),
                     mix=up.weight(mix), out=up.weight(out), moe=isinstance(lw.ffn, MoeW),
                     ffn={k: up.weight(q) for k, q in ffn.items()
                          if self.tier is None or not self.tier.holds(i, k)})
            if L["moe"]:
                L["moe_i"] = moe_i
                moe_i += 1
                L["smap"] = up.array(np.arange(d["E"], dtype=np.uint32), "device")
                if self.tier is not None and self.tier.holds(i, "gate_up"):
                    self.tier.build_layer(i, L)
            m = lw.mixer
            if lw.kind == "full_attention":
                L["gated"] = m.gated
                if m.q_norm is not None:
                    L["q_norm"], L["k_norm"] = up.array(m.q_norm), up.array(m.k_norm)
                n = self.ctx * d["nkv"] * d["hd"]
                L["kc"], L["vc"] = up.zeros(n), up.zeros(n)
            else:
                L["conv_w"] = up.array(m.conv)
                L["par"] = up.array(np.concatenate([m.dt_bias, m.neg_exp_a]).astype(np.float32))
                L["norm"] = up.array(m.norm)
                L["ring"] = up.zeros(2 * (d["K"] - 1) * d["cd"])
                L["ssm"] = up.zeros(2 * d["nv"] * d["dk"] * d["dv"])
            self.layers.append(L)
        self.regions = 2
        if self.w.mtp:
            m = self.w.mtp
            self.t_fc = up.weight(self.fc_w)
            self.t_norm_emb, self.t_norm_hidden = up.array(m.norm_emb), up.array(m.norm_hidden)
            self.t_mtp_norm = up.array(m.norm)
        self.t_norm = up.array(self.w.norm)
        self.s = {}
        for name, words in self._scratch_sizes().items():
            kind = "device" if name in ("x", "mx", "mtp_in", "h", "ed", "ridx") else "storage"
            dtype = np.uint32 if name == "ridx" else np.float32
            self.s[name] = up.zeros(words, dtype, kind)
        self.step = up.zeros(STEP_WORDS, np.uint32, "device")
        self.mtp_step = up.zeros(STEP_WORDS, np.uint32, "device")
        self.mtp_last = up.zeros(STEP_WORDS, np.uint32, "device")     # a block's last row alone
        if self.w.mtp:
            self.t_ids = up.zeros(d["V"], np.uint32, "device")   # the head's draft vocabulary
            self._ids, self._ids_width = None, 0
        self.out = {}      # (kind, rows) -> (logits, picks) device tensors
        for kind, rows in self._output_shapes():
            self._outputs(kind, rows)
        if self.tier is not None:
            self.tier.start()

    def _outputs(self, kind: str, rows: int):
        key = (kind, rows)
        if key not in self.out:
            self.out[key] = (self.up.zeros(rows * self.cfg.vocab_size, np.float32, "device"),
                             self.up.zeros(rows, np.uint32, "device"))
        return self.out[key]

    # --- recording ----------------------------------------------------------------
    def _op(self, stem, variant, tensors, groups, **push):
        shader = load_shader(stem, variant)
        g = (groups, 1, 1) if isinstance(groups, int) else tuple(groups) + (1,) * (3 - len(groups))
        key = (shader.name, tuple(id(t) for t in tensors), g)
        algo = self._algos.get(key)
        if algo is None:
            algo = self._algos[key] = self.dev.algorithm(shader, tensors, g, push)
        self._rec.append((algo, shader.pack(push)))

    def _gemv(self, w: DevWeight, x, y, rows, x_off=0, x_stride=None, y_off=0, y_stride=None, acc=False,
              row_of=None, out_rows=None):
        """y = w x for `rows` input rows; with ``row_of`` (a device list of
        weight rows) only those ``out_rows`` rows of w, in the list's order."""
        m = out_rows or w.rows
        assert row_of is None or not acc
        variant, tensors = w.variant + ("_acc" if acc else ""), [w.data, w.scales, x, y]
        if row_of is not None:
            variant, tensors = w.variant + "_rowmap", tensors + [row_of]
        self._op("gemv", variant, tensors, _groups(m),
                 rows=m, cols=w.cols_p, nvec=rows, x_off=x_off, x_stride=x_stride or w.cols_p,
                 y_off=y_off, y_stride=m if y_stride is None else y_stride)

    def _routed(self, w: DevWeight, x, y, pairs, x_div, x_stride, y_stride, per_expert_rows, smap, idx_off):
        s = self.s
        self._op("gemv", w.variant + "_routed", [w.data, w.scales, x, y, s["ridx"], smap],
                 (_groups(per_expert_rows), pairs), rows=per_expert_rows, cols=w.cols_p, nvec=pairs,
                 x_stride=x_stride, y_stride=y_stride, w_expert=per_expert_rows * w.words_per_row,
                 s_expert=per_expert_rows * w.scales_per_row, x_div=x_div, idx_off=idx_off)

    def _rmsnorm(self, x, w, y, rows, n, group=1, x_off=0, x_stride=0, x_inner=0, y_off=0,
                 y_stride=0, y_inner=0, z=None, z_off=0, z_stride=0, z_inner=0):
        tensors = [x, w, y] + ([z] if z is not None else [])
        self._op("rmsnorm", "gated" if z is not None else "plain", tensors, _groups(rows),
                 rows=rows, n=n, group=group, x_off=x_off, x_stride=x_stride, x_inner=x_inner,
                 y_off=y_off, y_stride=y_stride, y_inner=y_inner, z_off=z_off, z_stride=z_stride,
                 z_inner=z_inner, eps=self.cfg.rms_norm_eps, inv_n=np.float32(1.0 / n))

    def _record(self, kind: str, n: int, bucket: int, last: bool, listed: int = 0):
        d, s = self._dims(), self.s
        self._rec = []
        step = self.step if kind == "main" else self.mtp_step
        x = s["x"] if kind == "main" else s["mx"]
        if kind == "main":
            self._op("embed", None, [self.t_embed, x, step], _groups(n * d["H"]),
                     rows=n, n=d["H"], y_stride=d["Hp"])
            layers = self.layers[:len(self.w.layers)]
        else:
            F = P(2 * d["H"])
            self._op("embed", None, [self.t_embed, s["h"], step], _groups(n * d["H"]),
                     rows=n, n=d["H"], y_stride=d["Hp"])
            self._rmsnorm(s["h"], self.t_norm_emb, s["fcin"], n, d["H"], x_stride=d["Hp"], y_stride=F)
            self._rmsnorm(s["mtp_in"], self.t_norm_hidden, s["fcin"], n, d["H"], x_stride=d["Hp"],
                          y_off=d["H"], y_stride=F)
            self._gemv(self.t_fc, s["fcin"], x, n, y_stride=d["Hp"])
            layers = self.layers[len(self.w.layers):]
        for L in layers:
            self._rmsnorm(x, L["in_norm"], s["h"], n, d["H"], x_stride=d["Hp"], y_stride=d["Hp"])
            # the head absorbing a block: the rows before the last only write
            # their KV row (nothing else of theirs is ever read)
            m = 1 if kind == "mtp" and last and L["kind"] == "full_attention" else n
            if L["kind"] == "full_attention":
                self._attention(L, x, n, bucket, step, last_only=m < n)
            else:
                self._deltanet(L, x, n, step)
            o = (n - m) * d["Hp"]
            self._rmsnorm(x, L["post_norm"], s["h"], m, d["H"], x_off=o, x_stride=d["Hp"], y_stride=d["Hp"])
            (self._moe if L["moe"] else self._mlp)(L, x, m, x_off=o)
        rows = 1 if last else n
        norm = self.t_norm if kind == "main" else self.t_mtp_norm
        self._rmsnorm(x, norm, s["xn"], rows, d["H"], x_off=(n - rows) * d["Hp"], x_stride=d["Hp"],
                      y_stride=d["Hp"])
        logits, picks = self._outputs(kind, rows)
        width = listed or d["V"]                # listed: the head scores its draft vocabulary
        self._gemv(self.t_head, s["xn"], logits, rows, x_stride=d["Hp"],
                   row_of=self.t_ids if listed else None, out_rows=width)
        self._op("argmax", None, [logits, picks], _groups(rows), rows=rows, n=width, x_stride=width)
        segments, seq = [], self.dev.sequence()
        seq.record(self.kp.OpTensorSyncDevice([step] + ([s["mtp_in"], self.mtp_last] if kind == "mtp" else [])))
        for algo, push in self._rec:
            if algo == "sync_local":
                seq.record(self.kp.OpTensorSyncLocal(push))
            elif algo == "sync_device":
                seq.record(self.kp.OpTensorSyncDevice(push))
            elif algo == "host":                   # the sequence ends; the host works; the next begins
                segments.append((seq, push))
                seq = self.dev.sequence()
            else:
                seq.record(self.kp.OpAlgoDispatch(algo, push))
        seq.record(self.kp.OpTensorSyncLocal([x, logits, picks] + ([s["ridx"]] if self.tier else [])))
        segments.append((seq, None))
        self._rec = None
        return segments, logits, picks

    def _attention(self, L, x, n, bucket, step, last_only=False):
        """``last_only`` (the MTP head absorbing a block): every row writes
        its K/V row; only the last is attended and goes on (into its x row),
        with positions from the one-row ``mtp_last`` step."""
        d, s = self._dims(), self.s
        nh, nkv, hd, qw = d["nh"], d["nkv"], d["hd"], d["qw"]
        Pw = L["mix"].rows
        self._gemv(L["mix"], s["h"], s["proj"], n, x_stride=d["Hp"])
        if "q_norm" in L:
            self._rmsnorm(s["proj"], L["q_norm"], s["qn"], n * nh, hd, group=nh, x_stride=Pw,
                          x_inner=qw, y_stride=nh * hd, y_inner=hd)
            self._rmsnorm(s["proj"], L["k_norm"], s["kn"], n * nkv, hd, group=nkv, x_off=nh * qw,
                          x_stride=Pw, x_inner=hd, y_stride=nkv * hd, y_inner=hd)
            q_src = dict(t=s["qn"], x_off=0, x_stride=nh * hd, x_hstride=hd)
            k_src = dict(t=s["kn"], x_off=0, x_stride=nkv * hd, x_hstride=hd)
        else:
            q_src = dict(t=s["proj"], x_off=0, x_stride=Pw, x_hstride=qw)
            k_src = dict(t=s["proj"], x_off=nh * qw, x_stride=Pw, x_hstride=hd)
        rot = self.cfg.rotary_dim
        tabs = [self.t_cos, self.t_sin]

        def rope(src, dst, variant, heads, r, y_stride, rows=n, at=step):
            t = src.pop("t")
            self._op("rope", variant, [t] + tabs + [dst, at], _groups(rows * heads * hd),
                     rows=rows, heads=heads, hd=hd, rot=r, y_stride=y_stride, **src)

        rope(k_src, L["kc"], "cache", nkv, rot, nkv * hd)
        rope(dict(t=s["proj"], x_off=nh * qw + nkv * hd, x_stride=Pw, x_hstride=hd), L["vc"], "cache",
             nkv, 0, nkv * hd)
        a = n - 1 if last_only else 0            # the first row attended
        if last_only:
            n, step = 1, self.mtp_last
        q_src["x_off"] += a * q_src["x_stride"]
        rope(q_src, s["qr"], "rows", nh, rot, nh * hd, rows=n, at=step)
        common = dict(rows=n, heads=nh, kv_heads=nkv, hd=hd, s_stride=self.ctx,
                      scale=np.float32(hd ** -0.5))
        self._op("attend", "scores", [s["qr"], L["kc"], s["scores"], s["attn_o"], step],
                 (_groups(bucket), n * nh), q_stride=nh * hd, q_hstride=hd, **common)
        self._op("attend", "softmax", [s["qr"], L["kc"], s["scores"], s["attn_o"], step],
                 (1, n * nh), **common)
        self._op("attend", "out_gated" if L["gated"] else "out",
                 [s["proj"], L["vc"], s["scores"], s["attn_o"], step], (_groups(hd), n * nh),
                 q_stride=Pw, q_hstride=qw, gate_off=a * Pw + hd, o_stride=P(nh * hd), **common)
        self._gemv(L["out"], s["attn_o"], x, n, x_stride=P(nh * hd), y_off=a * d["Hp"], y_stride=d["Hp"],
                   acc=True)

    def _deltanet(self, L, x, n, step):
        d, s = self._dims(), self.s
        nk, nv, dk, dv, cd = d["nk"], d["nv"], d["dk"], d["dv"], d["cd"]
        Pw = L["mix"].rows
        self._gemv(L["mix"], s["h"], s["proj"], n, x_stride=d["Hp"])
        self._op("conv_step", None, [s["proj"], L["conv_w"], L["ring"], s["mixed"], step],
                 _groups(cd), rows=n, channels=cd, k=d["K"], x_stride=Pw, y_stride=cd)
        dn = dict(rows=n, nk=nk, nv=nv, dk=dk, dv=dv, m_stride=cd, ba_off=cd + nv * dv, ba_stride=Pw,
                  o_stride=nv * dv, scale=np.float32(dk ** -0.5), eps=np.float32(1e-6))
        tensors = [s["mixed"], s["proj"], L["par"], s["prep"], L["ssm"], s["dn_o"], step]
        self._op("deltanet_step", "prep", tensors, _groups(n * (2 * nk + nv)), **dn)
        self._op("deltanet_step", "scan", tensors, _groups(nv * dv), **dn)
        self._rmsnorm(s["dn_o"], L["norm"], s["dn_n"], n * nv, dv, group=nv, x_stride=nv * dv,
                      x_inner=dv, y_stride=P(nv * dv), y_inner=dv, z=s["proj"], z_off=cd,
                      z_stride=Pw, z_inner=dv)
        self._gemv(L["out"], s["dn_n"], x, n, x_stride=P(nv * dv), y_stride=d["Hp"], acc=True)

    def _mlp(self, L, x, n, x_off=0):
        """h rows 0..n-1 -> added to x from float x_off (so for _moe)."""
        d, s, f = self._dims(), self.s, L["ffn"]
        inter = f["down"].cols_p
        width = f["gate_up"].rows // 2
        self._gemv(f["gate_up"], s["h"], s["proj"], n, x_stride=d["Hp"])
        self._op("silu_mul", None, [s["proj"], s["act"]], _groups(n * width), rows=n, n=width,
                 x_stride=2 * width, y_stride=inter)
        self._gemv(f["down"], s["act"], x, n, x_stride=inter, y_off=x_off, y_stride=d["Hp"], acc=True)

    def _moe(self, L, x, n, x_off=0):
        d, s, f, c = self._dims(), self.s, L["ffn"], self.cfg
        E, k, H, mi = d["E"], d["k"], d["H"], c.moe_intermediate_size
        R = f["router"].rows
        off = L["moe_i"] * MAX_ROWS * k           # this layer's rows of the routing buffers
        self._gemv(f["router"], s["h"], s["rlog"], n, x_stride=d["Hp"])
        self._op("route", None, [s["rlog"], s["ridx"], s["rwt"]], _groups(n), rows=n, n=E, k=k,
                 x_stride=R, normalize=int(c.norm_topk_prob), y_off=off)
        if self.tier is not None and self.tier.holds_layer(L):
            # the host computes (or streams in) the pairs whose expert has no slot
            self._rec.append(("sync_local", [s["h"], s["ridx"]]))
            self._rec.append(("host", self.tier.host_step(L, n)))
            self._rec.append(("sync_device", [s["ed"], L["smap"]]))
        self._routed(f["gate_up"], s["h"], s["ey"], n * k, k, d["Hp"], 2 * mi, 2 * mi, L["smap"], off)
        self._op("silu_mul", None, [s["ey"], s["act"]], _groups(n * k * mi), rows=n * k, n=mi,
                 x_stride=2 * mi, y_stride=P(mi))
        self._routed(f["down"], s["act"], s["ed"], n * k, 1, P(mi), H, H, L["smap"], off)
        shared = "sh_down" in f
        if shared:
            si = f["sh_down"].cols_p
            w2 = f["sh_gate_up"].rows // 2
            self._gemv(f["sh_gate_up"], s["h"], s["proj"], n, x_stride=d["Hp"])
            self._op("silu_mul", None, [s["proj"], s["act"]], _groups(n * w2), rows=n, n=w2,
                     x_stride=2 * w2, y_stride=si)
            self._gemv(f["sh_down"], s["act"], s["sh"], n, x_stride=si, y_stride=H)
        self._op("moe_combine", "shared" if shared else "routed",
                 [x, s["ed"], s["rwt"], s["sh"], s["rlog"]], _groups(n * H), rows=n, n=H, k=k,
                 x_off=x_off, x_stride=d["Hp"], y_stride=H, s_stride=H, g_stride=R, g_off=E, w_off=off)

    def _sequence(self, kind, n, bucket, last, listed=0):
        key = (kind, n, bucket, last, listed)
        if key not in self._seqs:
            self._seqs[key] = self._record(kind, n, bucket, last, listed)
            self.recordings += 1
        return self._seqs[key]

    def warm(self, length: int = 0, copies: int = 0, listed: int = 0):
        """Record the decoding shapes (1..MAX_ROWS rows, trunk and MTP head) for
        every context bucket up to ``length`` tokens (default: the first) now:
        a driver that compiles pipelines at creation (Lavapipe: ~0.15 s per
        row count) then does not do it in the middle of a benchmark. The
        recurrent state first gets the regions for ``copies`` copy slots:
        growing them later records every shape again. ``listed``: the head
        will score a draft vocabulary of about that many ids (its device
        length and the next are recorded too)."""
        if self.regions < copies + 2:
            if self._state is None:
                self.new_state()
            self._grow(copies + 2)
        buckets = [self._bucket(1)]
        while buckets[-1] < min(length, self.ctx):
            buckets.append(self._bucket(buckets[-1] + 1))
        widths = [0]                             # 0: the whole vocabulary
        if listed:
            step, V = self.listed_step, self.cfg.vocab_size
            first = -(-listed // step) * step
            widths += sorted({min(V, first), min(V, first + step)})
        for bucket in buckets:
            for n in range(1, MAX_ROWS + 1):
                self._sequence("main", n, bucket, False)
                if self.w.mtp is not None:
                    for w in widths:
                        self._sequence("mtp", n, bucket, n > 1, w)

    def _bucket(self, length: int) -> int:
        b = 64
        while b < length:
            b *= 2
        return min(b, self.ctx)

    # --- state --------------------------------------------------------------------
    def new_state(self) -> DeviceState:
        """A fresh state. The device holds one: a new one replaces the last."""
        if self._state is not None:
            self._state.model = None
        seq, algos = self.dev.sequence(), []
        for L in self.layers:
            for name in ("ring", "ssm"):
                if name in L:
                    algos.append(self.dev.record_fill(seq, None, L[name], L[name].size()))
        if algos:                                # a pure-attention model has no recurrent state
            seq.eval()
        self._state = DeviceState(self)
        return self._state

    def _check(self, st):
        if st is not self._state or st.model is not self:
            raise VkspecError("this device state was replaced by a newer one (one state per model)")

    def _write_step(self, t, kv_len, live, tokens, pos, slots):
        a = t.data()
        a[:] = 0
        a[STEP_KV_LEN], a[STEP_LIVE], a[STEP_NROWS] = kv_len, live, len(tokens)
        a[STEP_SLOT:STEP_SLOT + MAX_ROWS] = NO_SLOT
        a[STEP_SLOT:STEP_SLOT + len(slots)] = slots
        a[STEP_TOK:STEP_TOK + len(tokens)] = tokens
        a[STEP_POS:STEP_POS + len(pos)] = pos

    def _rows(self, kind, tokens, last, logits_t, picks_t, ids=None, width=0):
        n, H, V = len(tokens), self.cfg.hidden_size, width or self.cfg.vocab_size
        x = self.s["x" if kind == "main" else "mx"].data()
        rows = 1 if last else n
        hidden = x[:n * self._dims()["Hp"]].reshape(n, -1)[:, :H].copy()
        logits = logits_t.data()[:rows * V].reshape(rows, V)
        picks = picks_t.data()[:rows].astype(np.int64)
        if ids is not None:                  # the listed ids, then padding that repeats the last
            logits, picks = logits[:, :len(ids)], ids[np.minimum(picks, len(ids) - 1)]
        logits = logits.copy()
        if kind == "main":
            self.last_picks = picks      # the device's argmax of each logits row
        else:
            self.last_mtp_picks = picks
        return hidden, logits

    def _validate(self, tokens, start):
        n = len(tokens)
        if not 1 <= n <= MAX_ROWS:
            raise VkspecError(f"a device block has 1 to {MAX_ROWS} rows, got {n}")
        if start + n > self.ctx:
            raise VkspecError(f"context full: {start} + {n} tokens > {self.ctx}")
        if min(tokens) < 0 or max(tokens) >= self.cfg.vocab_size:
            raise VkspecError(f"token id out of range 0..{self.cfg.vocab_size - 1}")

    def forward(self, tokens, st: DeviceState, logits_rows: str = "all", copies: int | bool = 0):
        """Feed n <= MAX_ROWS tokens at positions kv_len..; see Model.forward.
        ``copies`` rows (True: all but the last) keep the recurrent state after
        them in a copy slot, for :meth:`rewind`."""
        self._check(st)
        tokens = [int(t) for t in tokens]
        n = len(tokens)
        self._validate(tokens, st.kv_len)
        copies = min(n - 1, n - 1 if copies is True else int(copies))
        if self.regions < copies + 2:
            self._grow(copies + 2)
        free = [r for r in range(self.regions) if r != st.live]
        regions = free[:copies] + [None] * (n - 1 - copies) + [free[copies]]
        slots = [NO_SLOT if r is None else r for r in regions]
        self._write_step(self.step, st.kv_len, st.live, tokens, range(st.kv_len, st.kv_len + n), slots)
        last = logits_rows != "all" and n > 1
        segments, logits_t, picks_t = self._sequence("main", n, self._bucket(st.kv_len + n), last)
        st.block = (st.kv_len, n, st.live, regions)
        self._run(segments)
        if self.tier is not None:
            self.tier.after_forward(n)
        st.kv_len += n
        st.live = regions[-1]
        return self._rows("main", tokens, last, logits_t, picks_t)

    def rewind(self, st: DeviceState, keep: int):
        """Keep rows 0..keep-1 of the last block (0: none, the state before
        it): the watermark comes down and the region of row keep-1 becomes live."""
        self._check(st)
        if st.block is None:
            raise VkspecError("rewind needs a block forwarded just before")
        kv0, n, before, regions = st.block
        if not 0 <= keep <= n:
            raise VkspecError(f"rewind keeps 0..{n} rows, got {keep}")
        live = before if keep == 0 else regions[keep - 1]
        if live is None:
            raise VkspecError(f"row {keep - 1} of the last block has no copy slot")
        st.live, st.kv_len = live, kv0 + keep

    def mtp_forward(self, hidden, next_tokens, st: DeviceState, positions, logits_rows: str = "all", ids=None):
        """The MTP head on the device; see Model.mtp_forward. With
        logits_rows="last" the rows before the last only write their KV row
        (one recorded pass) and the last alone goes on to the lm_head. With
        ``ids`` the lm_head reads only those rows, through a device list
        padded to a multiple of listed_step (one recorded sequence per padded
        length)."""
        self._check(st)
        if self.w.mtp is None:
            raise VkspecError("the model was loaded without its MTP head")
        tokens = [int(t) for t in next_tokens]
        pos = [int(p) for p in positions]
        self._validate(tokens, max(pos) + 1 - len(tokens))
        n, d = len(tokens), self._dims()
        buf = self.s["mtp_in"].data()
        buf[:n * d["Hp"]].reshape(n, d["Hp"])[:, :d["H"]] = np.asarray(hidden, np.float32).reshape(n, d["H"])
        self._write_step(self.mtp_step, 0, 0, tokens, pos, [])
        self._write_step(self.mtp_last, 0, 0, tokens[-1:], pos[-1:], [])
        last = logits_rows != "all" and n > 1
        if ids is not None and not isinstance(ids, np.ndarray):
            ids = np.asarray(ids, np.int64)
        listed = 0 if ids is None else self._list_ids(ids)
        segments, logits_t, picks_t = self._sequence("mtp", n, self._bucket(max(pos) + 1), last, listed)
        self._run(segments)
        hidden, logits = self._rows("mtp", tokens, last, logits_t, picks_t, ids, listed)
        return (hidden[-1:], logits) if last else (hidden, logits)

    def _list_ids(self, ids) -> int:
        """Put a draft vocabulary (an array DraftVocab replaces, never edits) on
        the device if it is not the one there; its padded length."""
        k, V = len(ids), self.cfg.vocab_size
        if not 1 <= k <= V:
            raise VkspecError(f"a draft vocabulary has 1 to {V} ids, got {k}")
        width = min(V, -(-k // self.listed_step) * self.listed_step)
        if self._ids is not ids or self._ids_width != width:
            if int(np.min(ids)) < 0 or int(np.max(ids)) >= V:
                raise VkspecError(f"a draft vocabulary id is out of range 0..{V - 1}")
            a = self.t_ids.data()
            a[:k] = ids
            a[k:width] = ids[-1]         # argmax keeps the first of equal scores: index k-1
            seq = self.dev.sequence()
            seq.record(self.kp.OpTensorSyncDevice([self.t_ids]))
            seq.eval()
            self._ids, self._ids_width = ids, width
        return width

    def _run(self, segments):
        for seq, host in segments:
            if self.timing is None:
                seq.eval()
            else:                                # vkspec.bench: device time vs host time
                t0 = time.perf_counter()
                seq.eval()
                self.timing["eval"] += time.perf_counter() - t0
            if host is not None:
                host()

    def _n_moe(self) -> int:
        return max(1, sum(isinstance(lw.ffn, MoeW) for lw in self._layers_w()))

    # --- copy slots ---------------------------------------------------------------
    def _grow(self, regions: int):
        """Give every recurrent state buffer `regions` regions, the live one
        moved to region 0 (the last block can no longer be rewound). A failed
        allocation releases what it made and leaves the live state as it was."""
        st = self._state
        made = []
        try:
            for L in self.layers:
                for name in ("ring", "ssm"):
                    if name in L:
                        made.append((L, name, self.up.zeros(L[name].size() // self.regions * regions)))
        except Exception as e:
            for _, _, t in made:
                self.up.release(t)
            raise VkspecError(f"could not allocate {regions - 2} recurrent copy slots: {e}") from None
        seq = self.dev.sequence()
        keep = []
        for L, name, t in made:
            words = L[name].size() // self.regions
            keep.append(self.dev.record_fill(seq, L[name], t, words, src_off=st.live * words))
        if keep:
            seq.eval()
        del keep
        self._seqs.clear()
        old = set()
        for L, name, t in made:
            old.add(id(L[name]))
            self.up.release(L[name])
            L[name] = t
        self._algos = {k: a for k, a in self._algos.items() if not old & set(k[1])}
        self.regions, st.live, st.block = regions, 0, None

    def snapshot(self, st: DeviceState) -> State:
        """A host copy of the state (KV rows up to the watermark, the MTP head's
        rows just past it, the live recurrent state), for :meth:`restore`."""
        snap = self.read_state(st)
        if self.w.mtp is not None:
            L, d = self.layers[-1], self._dims()
            rows = min(self.ctx, st.kv_len + MAX_ROWS)
            n = rows * d["nkv"] * d["hd"]
            snap.mtp_k = self.dev.read(L["kc"], 0, n).reshape(rows, d["nkv"], d["hd"])
            snap.mtp_v = self.dev.read(L["vc"], 0, n).reshape(rows, d["nkv"], d["hd"])
        return snap

    def restore(self, st: DeviceState, snap: State):
        """Make st hold a snapshot's state (st stays this model's live state)."""
        self._check(st)
        trunk = [L for L in self.layers[:len(self.w.layers)]]
        attn = [L for L in trunk if L["kind"] == "full_attention"]
        delta = [L for L in trunk if L["kind"] != "full_attention"]
        for L, k, v in zip(attn, snap.kv_k, snap.kv_v):
            self.dev.write(L["kc"], 0, np.asarray(k)[:snap.kv_len])
            self.dev.write(L["vc"], 0, np.asarray(v)[:snap.kv_len])
        for L, conv, ssm in zip(delta, snap.conv, snap.ssm):
            w = L["ring"].size() // self.regions
            self.dev.write(L["ring"], st.live * w, conv)
            w = L["ssm"].size() // self.regions
            self.dev.write(L["ssm"], st.live * w, ssm)
        if self.w.mtp is not None and snap.mtp_k is not None:
            self.dev.write(self.layers[-1]["kc"], 0, snap.mtp_k)
            self.dev.write(self.layers[-1]["vc"], 0, snap.mtp_v)
        st.kv_len, st.block = snap.kv_len, None

    def read_state(self, st: DeviceState) -> State:
        """The live state as host arrays (KV rows up to the watermark) - for tests."""
        self._check(st)
        d, dev = self._dims(), self.dev
        kv_k, kv_v, conv, ssm = [], [], [], []
        row = d["nkv"] * d["hd"]
        for L in self.layers[:len(self.w.layers)]:
            if L["kind"] == "full_attention":
                kv_k.append(dev.read(L["kc"], 0, st.kv_len * row).reshape(st.kv_len, d["nkv"], d["hd"]))
                kv_v.append(dev.read(L["vc"], 0, st.kv_len * row).reshape(st.kv_len, d["nkv"], d["hd"]))
            else:
                w = L["ring"].size() // self.regions
                conv.append(dev.read(L["ring"], st.live * w, w).reshape(d["K"] - 1, d["cd"]))
                w = L["ssm"].size() // self.regions
                ssm.append(dev.read(L["ssm"], st.live * w, w).reshape(d["nv"], d["dk"], d["dv"]))
        return State(kv_k, kv_v, conv, ssm, kv_len=st.kv_len)
