"""A family's layer is one description (vkspec.layer_graph): a family defined
in this file alone, with a layer no shipped family has, runs on the NumPy
definition, the compiled CPU path and the device.

The family: GPT-J's parallel residual on Qwen3's weights, x + attn(n(x)) +
ffn(n(x)) with one norm, on a dense and a MoE checkpoint. Its logits are held
to the same formula written with transformers' own Qwen3 modules; the three
CPU paths and the device to each other byte for byte.
"""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import forward_both, layer_calls_three_ways, require

torch = require("torch")
require("transformers")
pytestmark = pytest.mark.oracle

from family_models import build  # noqa: E402

from vkspec import families  # noqa: E402
from vkspec.errors import VkspecError  # noqa: E402
from vkspec.layer_graph import Add, LayerGraph, Norm, Sub  # noqa: E402
from vkspec.loader import load_model  # noqa: E402
from vkspec.speculative import generate  # noqa: E402

PARALLEL = LayerGraph("parallel", (Norm("input_layernorm"), Sub("mixer"), Sub("ffn"), Add("mixer"), Add("ffn")))
FAMILY = families.Family(qk_norm=True, norm_topk_default=False, layer=PARALLEL)
PROMPT = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 46, 26]
LOGIT_TOL = 1e-4


@pytest.fixture(autouse=True)
def toy_family(monkeypatch):
    monkeypatch.setitem(families.FAMILIES, "toy_parallel", FAMILY)


def parallel_checkpoint(base: str, d):
    """transformers' Qwen3 (or Qwen3-MoE) model saved as the toy family, without
    the post-attention norms its layer never reads."""
    ref = build(base, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "toy_parallel"}))
    t = load_file(str(d / "model.safetensors"))
    save_file({k: v for k, v in t.items() if "post_attention_layernorm" not in k}, str(d / "model.safetensors"))
    return ref


def parallel_logits(ref, ids):
    """The toy layer with transformers' modules: h = input_layernorm(x); x + self_attn(h) + mlp(h)."""
    m = ref.model
    with torch.no_grad():
        x = m.embed_tokens(torch.tensor([ids]))
        n = len(ids)
        pe = m.rotary_emb(x, torch.arange(n)[None])
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        for layer in m.layers:
            h = layer.input_layernorm(x)
            a = layer.self_attn(hidden_states=h, position_embeddings=pe, attention_mask=mask)[0]
            f = layer.mlp(h)
            x = x + a + (f[0] if isinstance(f, tuple) else f)
        return ref.lm_head(m.norm(x))[0].numpy()


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe"])
def toy(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(families.FAMILIES, "toy_parallel", FAMILY)
        ref = parallel_checkpoint(request.param, d)
        return ref, load_model(d), d


def test_the_family_runs_the_layer_it_describes(toy):
    ref, model, _ = toy
    assert model.cfg.layer_graph is PARALLEL
    assert all(set(lw.norms) == {"input_layernorm"} for lw in model.w.layers)
    _, got = model.forward(PROMPT, model.new_state())
    assert np.abs(got - parallel_logits(ref, PROMPT)).max() < LOGIT_TOL


def test_greedy_ids_follow_the_formula(toy):
    ref, model, _ = toy
    ids = list(PROMPT[:5])
    for _ in range(12):
        ids.append(int(np.argmax(parallel_logits(ref, ids)[-1])))
    assert generate(model, PROMPT[:5], 12).tokens == ids[5:]


@pytest.mark.parametrize("acts", ["f32", "q8"])
def test_layer_calls_run_the_graph(acts, tmp_path, monkeypatch):
    """The compiled CPU path walks the same steps: its bits are the general
    path's and the NumPy definition's."""
    parallel_checkpoint("qwen3", tmp_path)
    model = load_model(tmp_path, fmt="int4-g64", activations=acts)
    calls, general, definition = layer_calls_three_ways(model, [PROMPT[:9], PROMPT[9:13]], monkeypatch)
    assert calls == general == definition


def test_device_records_the_graph(toy, vk):
    """Two prefill blocks and decode steps: hidden rows and logits byte for byte."""
    _, cpu, d = toy
    dev = load_model(d, backend="vulkan")
    sc, sv = cpu.new_state(), dev.new_state()
    for i in range(0, 13, 8):
        _, lc = forward_both(cpu, dev, sc, sv, PROMPT[i:min(i + 8, 13)])
    for _ in range(4):
        tok = int(np.argmax(lc[-1]))
        _, lc = forward_both(cpu, dev, sc, sv, [tok])


@pytest.mark.parametrize("steps, why", [
    ((Norm("a"), Sub("mixer"), Norm("b"), Sub("ffn"), Add("mixer"), Add("ffn")), "reads x while mixer"),
    ((Norm("a"), Sub("mixer"), Sub("ffn"), Add("ffn"), Add("mixer")), "in the order of their sublayers"),
    ((Norm("a"), Sub("mixer"), Add("mixer")), "one Sub and one Add of each"),
    ((Sub("mixer"), Norm("a"), Add("mixer"), Sub("ffn"), Add("ffn")), "before any Norm"),
])
def test_a_graph_the_backends_cannot_run_is_refused_in_one_line(steps, why):
    with pytest.raises(VkspecError, match=why) as e:
        LayerGraph("bad", steps)
    assert "\n" not in str(e.value)


def test_an_unknown_sublayer_is_refused_in_one_line():
    with pytest.raises(VkspecError, match="a sublayer is one of mixer, ffn"):
        Sub("attention")


def test_the_norms_a_graph_reads():
    """The loader reads a graph's norms; the MTP head's earlier rows write
    their KV from the mixer's own input norm, wherever the mixer comes."""
    ffn_first = LayerGraph("ffn first", (Norm("a"), Sub("ffn"), Add("ffn", "c"), Norm("b"), Sub("mixer"), Add("mixer")))
    assert ffn_first.norm_names == ("a", "c", "b") and ffn_first.mixer_norm == "b" and ffn_first.out_norms
    assert PARALLEL.norm_names == ("input_layernorm",) and not PARALLEL.out_norms
