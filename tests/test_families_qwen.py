"""The Qwen families from Hugging Face checkpoints: qwen2, qwen3 (q/k norms,
attention_bias), qwen3_moe (no shared expert, a dense layer), qwen3_5 and
qwen3_5_moe (Qwen3-Next's forward with separate in_proj_qkv/z/b/a, and an MTP
head), and Qwen3.5's composite Hub layout.

Each against transformers 5.18's own model at tiny random sizes: logits
within LOGIT_TOL (torch sums in its own order), greedy ids equal; the MTP head
(no transformers module) against its formula written with transformers'
decoder layer; the device against the CPU byte for byte, one device model
per family.
"""

import json

import numpy as np
import pytest

from conftest import bits_equal, forward_both, layer_calls_three_ways, require

torch = require("torch")
require("transformers")
pytestmark = pytest.mark.oracle

from family_models import add_mtp, build  # noqa: E402

from vkspec.config import from_dict  # noqa: E402
from vkspec.errors import VkspecError  # noqa: E402
from vkspec.loader import load_model  # noqa: E402
from vkspec.speculative import generate  # noqa: E402

LOGIT_TOL = 1e-4
PROMPT = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 46, 26]
FAMILIES = ["qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe"]


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """(transformers model, vkspec CPU model, folder, name); the Qwen3.5
    checkpoints carry random mtp.* tensors (transformers ignores them)."""
    name = request.param
    d = tmp_path_factory.mktemp(name)
    ref = build(name, d)
    if name.startswith("qwen3_5"):
        add_mtp(d)
    return ref, load_model(d), d, name


def test_the_family_is_what_its_config_says(pair):
    _, model, _, name = pair
    c = model.cfg
    assert c.norm_plus_one == name.startswith("qwen3_5")
    assert c.qk_norm == (name != "qwen2") and c.attn_gate == name.startswith("qwen3_5")
    assert (c.qkv_bias, c.o_bias) == {"qwen2": (True, False), "qwen3": (True, True)}.get(name, (False, False))
    moe = [i for i in range(c.num_hidden_layers) if c.is_moe_layer(i)]
    assert moe == {"qwen3_moe": [0, 2, 3], "qwen3_5_moe": [0, 1, 2, 3]}.get(name, [])
    assert model.has_mtp == name.startswith("qwen3_5")


def test_prefill_logits(pair):
    ref, model, _, _ = pair
    with torch.no_grad():
        want = ref(torch.tensor([PROMPT]), use_cache=False).logits[0].numpy()
    _, got = model.forward(PROMPT, model.new_state())
    assert np.abs(got - want).max() < LOGIT_TOL


def test_decode_steps_and_block_on_cache(pair):
    ref, model, _, _ = pair
    st = model.new_state()
    model.forward(PROMPT[:8], st)
    with torch.no_grad():
        out = ref(torch.tensor([PROMPT[:8]]), use_cache=True)
        cache = out.past_key_values
        for t in PROMPT[8:10]:
            out = ref(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            _, got = model.forward([t], st)
            assert np.abs(got[0] - out.logits[0, -1].numpy()).max() < LOGIT_TOL
        block = PROMPT[10:16]
        out = ref(torch.tensor([block]), past_key_values=cache, use_cache=True)
    _, got = model.forward(block, st)
    assert np.abs(got - out.logits[0].numpy()).max() < LOGIT_TOL


def test_greedy_ids_32(pair):
    ref, model, _, name = pair
    with torch.no_grad():
        want = ref.generate(torch.tensor([PROMPT[:5]]), max_new_tokens=32, do_sample=False,
                            min_new_tokens=32, pad_token_id=0)[0, 5:].tolist()
    assert generate(model, PROMPT[:5], 32).tokens == want, name


@pytest.mark.parametrize("acts", ["f32", "q8"])
@pytest.mark.parametrize("name", ["qwen2", "qwen3", "qwen3_moe", "qwen3_5"])
def test_layer_calls_are_the_general_path_and_the_definition(name, acts, tmp_path, monkeypatch):
    """Qwen2's q/k/v biases, Qwen3's q/k norms and o bias, Qwen3-MoE's
    attention beside its experts, Qwen3.5's MLPs beside its DeltaNet and
    gated attention, in int4 blocks, with either arithmetic: layer_calls
    gives the general path's and the NumPy definition's bits."""
    build(name, tmp_path)
    model = load_model(tmp_path, fmt="int4-g64", activations=acts)
    calls, general, definition = layer_calls_three_ways(model, [PROMPT[:9], PROMPT[9:13]], monkeypatch)
    assert calls == general == definition


def test_warm_runs_a_moe_decode_row_in_its_one_call(tmp_path, monkeypatch):
    """A decode row of a q8 MoE layer runs in expert_table's one call, a
    compiled function of its own; warm() must load it, or the first timed
    decode step pays for it (29 ms at 30B-A3B widths, 2x that step)."""
    from vkspec.backends.cpu import expert_table

    build("qwen3_moe", tmp_path)
    model = load_model(tmp_path, fmt="int4-g64", activations="q8")
    rows, real = [], expert_table._moe_row

    def seen(x, *args):
        rows.append(x.shape[0])
        return real(x, *args)
    monkeypatch.setattr(expert_table, "_moe_row", seen)
    model.warm()
    assert 1 in rows


def test_device_equals_cpu(pair, vk):
    """Two prefill blocks, decode steps, and the MTP head after each step
    where there is one: hidden rows, logits and picks byte for byte."""
    _, cpu, d, _ = pair
    dev = load_model(d, backend="vulkan")
    sc, sv = cpu.new_state(), dev.new_state()
    toks = PROMPT[:13]
    for i in range(0, len(toks), 8):
        hc, lc = forward_both(cpu, dev, sc, sv, toks[i:i + 8])
    for _ in range(5):
        tok = int(np.argmax(lc[-1]))
        assert dev.last_picks[-1] == tok
        hc, lc = cpu.forward([tok], sc)
        hv, lv = dev.forward([tok], sv)
        bits_equal(hv, hc)
        bits_equal(lv, lc)
        if cpu.has_mtp:
            nxt = int(np.argmax(lc[-1]))
            mc = cpu.mtp_forward(hc, [nxt], sc, [sc.kv_len])
            mv = dev.mtp_forward(hv, [nxt], sv, [sv.kv_len])
            bits_equal(mv[0], mc[0])
            bits_equal(mv[1], mc[1])


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_5_moe"])
def test_mtp_head_is_the_written_out_formula(name, tmp_path):
    """fc(cat[norm_emb(embed(t+1)), norm_hidden(h_t)]) -> a full-attention
    decoder layer (transformers' own Qwen3.5 layer) -> norm -> lm_head, all
    norms (1 + w)."""
    import transformers as T
    from safetensors.numpy import load_file
    build(name, tmp_path)
    add_mtp(tmp_path)
    model = load_model(tmp_path)
    raw = {k: torch.from_numpy(v.copy()) for k, v in load_file(str(tmp_path / "model.safetensors")).items()}
    cfgd = json.loads((tmp_path / "config.json").read_text())
    cfgd.update(layer_types=["full_attention"], num_hidden_layers=1)
    moe = name == "qwen3_5_moe"
    Config, Layer, Rot = ((T.Qwen3_5MoeTextConfig, T.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeDecoderLayer,
                           T.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeTextRotaryEmbedding) if moe else
                          (T.Qwen3_5TextConfig, T.models.qwen3_5.modeling_qwen3_5.Qwen3_5DecoderLayer,
                           T.models.qwen3_5.modeling_qwen3_5.Qwen3_5TextRotaryEmbedding))
    cfg = Config(**{k: v for k, v in cfgd.items() if k not in ("architectures", "model_type")})
    layer = Layer(cfg, 0).float().eval()
    sd = {k[len("mtp.layers.0."):]: v for k, v in raw.items()
          if k.startswith("mtp.layers.0.") and ".experts." not in k}
    if moe:
        ex, e = "mtp.layers.0.mlp.experts", range(cfg.num_experts)
        sd["mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([raw[f"{ex}.{i}.gate_proj.weight"], raw[f"{ex}.{i}.up_proj.weight"]]) for i in e])
        sd["mlp.experts.down_proj"] = torch.stack([raw[f"{ex}.{i}.down_proj.weight"] for i in e])
    layer.load_state_dict(sd)
    rot = Rot(cfg)

    def rms(x, w, eps=1e-6):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)

    st = model.new_state()
    toks = [5, 9, 14, 200, 33, 7]
    hidden, _ = model.forward(toks, st)
    h_t, nxt, pos = hidden[:5], toks[1:], np.arange(0, 5)
    _, got = model.mtp_forward(h_t, nxt, st, pos)
    with torch.no_grad():
        e = rms(raw["model.embed_tokens.weight"][nxt], raw["mtp.pre_fc_norm_embedding.weight"])
        hh = rms(torch.from_numpy(h_t), raw["mtp.pre_fc_norm_hidden.weight"])
        x = (torch.cat([e, hh], -1) @ raw["mtp.fc.weight"].T)[None]
        pos_ids = torch.from_numpy(pos)[None]
        mask = torch.full((5, 5), float("-inf")).triu(1)[None, None]
        x = layer(x, position_embeddings=rot(x, pos_ids.expand(3, 1, -1)), attention_mask=mask,
                  position_ids=pos_ids)
        x = x[0] if isinstance(x, tuple) else x
        want = rms(x[0], raw["mtp.norm.weight"]) @ raw["lm_head.weight"].T
    assert np.abs(got - want.numpy()).max() < LOGIT_TOL


def test_composite_checkpoint_is_its_text_model(tmp_path):
    """Qwen3.5 as on the Hub: model_type qwen3_5, the text config under
    text_config, tensors under model.language_model.*, a vision tower
    (never read), top-level lm_head and mtp.*: vkspec runs the text model that
    transformers' AutoModelForCausalLM makes of the folder."""
    import transformers as T
    build("qwen3_5_composite", tmp_path)
    add_mtp(tmp_path)
    model = load_model(tmp_path)
    assert model.cfg.model_type == "qwen3_5_text" and model.has_mtp
    ref = T.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([PROMPT]), use_cache=False).logits[0].numpy()
    _, got = model.forward(PROMPT, model.new_state())
    assert np.abs(got - want).max() < LOGIT_TOL
    assert generate(model, PROMPT[:5], 1).tokens[0] == int(np.argmax(want[4]))


@pytest.mark.parametrize("edit,why", [
    ({"model_type": "mamba9"}, "unknown model_type 'mamba9'"),
    ({"use_sliding_window": True}, "sliding-window attention"),
    ({"layer_types": ["sliding_attention"] * 4}, "sliding-window attention"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "rope_type 'yarn'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"mtp_use_dedicated_embeddings": True}, "mtp_use_dedicated_embeddings"),
])
def test_what_is_not_implemented_is_refused_in_one_line(edit, why):
    d = {"model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
         "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    with pytest.raises(VkspecError) as e:
        from_dict({**d, **edit}, "x/config.json")
    assert why in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("x/config.json: ")
