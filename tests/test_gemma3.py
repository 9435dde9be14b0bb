"""Gemma 3 at tiny random sizes built by transformers 5.18 (tests/oracle_gemma3.py):
vkspec's CPU path against transformers, from safetensors and from the same
model written as a GGUF (read back by transformers' own GGUF loader); the
device against the CPU byte for byte over prompts far longer than the
sliding window, blocks whose rows straddle the window's edge included."""

import json

import numpy as np
import pytest

from conftest import bits_equal, forward_both, layer_calls_three_ways, require

torch = require("torch")
require("transformers")
pytestmark = pytest.mark.oracle
require("gguf")

from oracle_gemma3 import build, gguf_build, write_gguf  # noqa: E402

from vkspec.config import from_dict  # noqa: E402
from vkspec.errors import VkspecError  # noqa: E402
from vkspec.loader import load_model  # noqa: E402
from vkspec.speculative import generate  # noqa: E402

LOGIT_TOL = 1e-4
WINDOW = 4


def ids(n, seed=0):
    return [2] + [int(t) for t in np.random.default_rng(seed).integers(3, 512, n - 1)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma3")
    return build(d, window=WINDOW), d


@pytest.fixture(scope="module")
def cpu(tiny):
    return load_model(tiny[1], ctx=256)


def logits(ref, toks, **kw):
    with torch.no_grad():
        return ref(torch.tensor([toks]), **kw)


def test_the_config_says_which_layers_slide_and_their_rope_bases(cpu):
    c = cpu.cfg
    assert c.layer_windows == [WINDOW, WINDOW, 0, WINDOW, WINDOW, 0]
    assert c.layer_rope_theta == [1e4, 1e4, 1e6, 1e4, 1e4, 1e6]
    assert c.embedding_scale == float(np.float32(8.0)) and c.scores_scale == 0.25
    assert c.hidden_act == "gelu_tanh" and c.sandwich_norms and c.qk_norm and c.norm_plus_one
    assert c.tie_word_embeddings


def test_prefill_logits_of_a_prompt_ten_windows_long(tiny, cpu):
    ref, _ = tiny
    toks = ids(40)
    want = logits(ref, toks, use_cache=False).logits[0].numpy()
    _, got = cpu.forward(toks, cpu.new_state())
    assert np.abs(got - want).max() < LOGIT_TOL


def test_decode_steps_and_a_block_on_the_cache(tiny, cpu):
    ref, _ = tiny
    toks = ids(24, seed=1)
    st = cpu.new_state()
    cpu.forward(toks[:12], st)
    out = logits(ref, toks[:12], use_cache=True)
    cache = out.past_key_values
    for t in toks[12:15]:
        out = logits(ref, [t], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        _, got = cpu.forward([t], st)
        assert np.abs(got[0] - out.logits[0, -1].numpy()).max() < LOGIT_TOL
    out = logits(ref, toks[15:21], past_key_values=cache, use_cache=True)     # 6 rows > the window
    _, got = cpu.forward(toks[15:21], st)
    assert np.abs(got - out.logits[0].numpy()).max() < LOGIT_TOL


def test_greedy_ids_32(tiny, cpu):
    ref, _ = tiny
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids(5)]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                            pad_token_id=0)[0, 5:].tolist()
    assert generate(cpu, ids(5), 32).tokens == want


@pytest.mark.parametrize("acts", ["f32", "q8"])
def test_layer_calls_are_the_general_path_and_the_definition(tiny, monkeypatch, acts):
    """Sandwich norms, q/k norms, GELU, sliding windows and two RoPE bases, in
    int4 blocks, with either arithmetic: layer_calls gives the general
    path's and the NumPy definition's bits past the window."""
    model = load_model(tiny[1], ctx=256, fmt="int4-g64", activations=acts)
    toks = ids(20, seed=3)
    calls, general, definition = layer_calls_three_ways(model, [toks[:12], toks[12:17], toks[17:]], monkeypatch)
    assert calls == general == definition


def test_the_device_equals_the_cpu_past_the_window(vk, tiny, cpu):
    """A 150-token prompt in 8-row blocks (windows start past a 128-column
    block: attend.comp skips it), blocks of 6 rows rewound to 2 (verify
    blocks straddling the window's edge), greedy decode steps: hidden rows,
    logits and the device's picks equal the CPU's."""
    dev = load_model(tiny[1], backend="vulkan", ctx=256)
    sc, sv = cpu.new_state(), dev.new_state()
    toks = ids(150, seed=2)
    for i in range(0, len(toks), 8):
        hc, lc = forward_both(cpu, dev, sc, sv, toks[i:i + 8])
    for step in range(12):
        tok = int(np.argmax(lc[-1]))
        assert dev.last_picks[len(lc) - 1] == tok
        block = [tok] + ids(6, seed=10 + step)[1:] if step % 3 == 0 else [tok]
        hc, lc = forward_both(cpu, dev, sc, sv, block, copies=True)
        if len(block) > 1:                      # a verify block: keep two rows
            cpu.rewind(sc, 2)
            dev.rewind(sv, 2)
            lc = lc[:2]
    assert sc.kv_len == sv.kv_len


def test_a_gguf_written_as_llama_cpp_does_loads_in_transformers_and_vkspec(tmp_path):
    """Norms stored as 1 + w, pattern 6, head_dim 256: transformers' GGUF
    loader gets the model back, vkspec's GGUF run equals its safetensors run
    bit for bit (the 1 is never added twice) and transformers within LOGIT_TOL."""
    transformers = require("transformers")
    src = gguf_build(tmp_path / "st")
    (tmp_path / "g").mkdir()
    path = write_gguf(src, tmp_path / "g" / "tiny.gguf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    toks = ids(20, seed=3)
    want = logits(hf, toks, use_cache=False).logits[0].numpy()
    g, s = load_model(path), load_model(tmp_path / "st")
    assert g.cfg.layer_windows == [4] * 5 + [0] and not g.cfg.norm_plus_one and s.cfg.norm_plus_one
    _, lg = g.forward(toks, g.new_state())
    _, ls = s.forward(toks, s.new_state())
    bits_equal(lg, ls)
    assert np.abs(lg - want).max() < LOGIT_TOL


@pytest.mark.parametrize("change,message", [
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"hidden_activation": "relu"}, "hidden_activation"),
    ({"layer_types": ["sliding_attention"] * 2}, "layer_types"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0}}}, "rope_type"),
])
def test_what_is_not_implemented_is_one_clear_error(tiny, change, message):
    d = json.loads((tiny[1] / "config.json").read_text())
    with pytest.raises(VkspecError, match=message):
        from_dict({**d, **change}, "config.json")


def test_layer_types_default_to_the_pattern_of_six():
    d = {"model_type": "gemma3_text", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 12,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 8,
         "rms_norm_eps": 1e-6, "sliding_window": 16, "rope_theta": 1e6, "rope_local_base_freq": 1e4}
    c = from_dict(d)
    assert [i for i, w in enumerate(c.layer_windows) if w == 0] == [5, 11]
    assert c.rope_theta_of(5) == 1e6 and c.rope_theta_of(0) == 1e4 and c.scores_scale == 256 ** -0.5


def test_bos_is_added_once_where_the_tokenizer_config_asks(tmp_path):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from vkspec.tokenizer import load_tokenizer
    tk = Tokenizer(models.WordLevel({"<unk>": 0, "<bos>": 1, "a": 2, "b": 3}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens([AddedToken("<bos>", special=True, normalized=False)])
    tk.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path).encode("a b") == [2, 3]          # no tokenizer_config.json
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "bos_token": "<bos>"}))
    tok = load_tokenizer(tmp_path)
    assert tok.encode("a b") == [1, 2, 3]
    assert tok.encode("<bos>a b") == [1, 2, 3]                         # a template that writes it: once
