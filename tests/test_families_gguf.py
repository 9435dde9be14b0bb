"""GGUF files of the Qwen families, written here with the gguf package's
GGUFWriter as llama.cpp's converter names them (families.md §2-§4, §7).

* qwen2, qwen3, qwen3moe, from tiny transformers models: vkspec's GGUF run
  equals its safetensors run of the same model bit for bit (the same f32
  weights; no q/k row permutation outside llama), and matches transformers
  loading the same GGUF (logits within LOGIT_TOL, greedy ids equal).
* qwen3next (llama.cpp's names: attn_qkv + attn_gate, ssm_ba grouped,
  ssm_a = -exp(A_log), norms stored 1 + w, block_count counting the MTP
  block, nextn.*), from vkspec's tiny hybrid: no transformers loader exists,
  so its run must equal the safetensors run byte for byte, with and without
  the MTP head (in the file, or alone in an mtp-*.gguf beside it), on both
  backends. qwen35 / qwen35moe: test_families_qwen35_gguf.py.
"""

import numpy as np
import pytest

from conftest import require

torch = require("torch")
pytestmark = pytest.mark.oracle
transformers = require("transformers")
gguf = require("gguf")

from family_models import build, write_gguf, write_qwen3next_gguf  # noqa: E402

from vkspec.errors import VkspecError  # noqa: E402
from vkspec.loader import load_model  # noqa: E402
from vkspec.speculative import generate  # noqa: E402
from vkspec.tiny import make_tiny  # noqa: E402

LOGIT_TOL = 1e-4
PROMPT = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 46, 26]
# arch -> the tiny model written to it (qwen3: head_dim 128, the only one
# transformers' qwen3 GGUF loader reads right; qwen3moe: every layer MoE,
# renormalised, which is all a GGUF can say)
ARCHS = {"qwen2": "qwen2", "qwen3": "qwen3_hd128", "qwen3moe": "qwen3_moe_all"}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def written(request, tmp_path_factory):
    """(arch, folder with the safetensors, the GGUF path, the source model)."""
    arch = request.param
    d = tmp_path_factory.mktemp(arch)
    ref = build(ARCHS[arch], d)
    return arch, d, write_gguf(ref, d / f"{arch}.gguf", arch), ref


def run(model, toks, steps=4):
    """Bytes of a prefill block and greedy decode steps (hidden and logits)."""
    st, out = model.new_state(), []
    h, lg = model.forward(toks, st)
    out += [h.tobytes(), lg.tobytes()]
    for _ in range(steps):
        h, lg = model.forward([int(np.argmax(lg[-1]))], st)
        out += [h.tobytes(), lg.tobytes()]
    return out


def test_gguf_config_reads_the_arch(written):
    arch, _, path, ref = written
    c = load_model(path).cfg
    hc = ref.config
    assert c.model_type == {"qwen3moe": "qwen3_moe"}.get(arch, arch)
    assert c.head_dim == (getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads)
    assert (c.qkv_bias, c.o_bias, c.qk_norm, c.norm_plus_one) == (arch == "qwen2", False, arch != "qwen2", False)
    assert c.num_experts == (4 if arch == "qwen3moe" else 0)
    if arch == "qwen3moe":
        assert c.norm_topk_prob and c.mlp_only_layers == [] and c.moe_intermediate_size == 32


def test_gguf_run_equals_the_safetensors_run(written):
    _, d, path, _ = written
    assert run(load_model(path), PROMPT) == run(load_model(d), PROMPT)


@pytest.mark.parametrize("written", ["qwen3moe"], indirect=True)
def test_expert_tensors_are_row_views_of_the_file(written):
    """Expert e of a 3-D ffn_*_exps tensor is its rows [e*mi, (e+1)*mi): a view."""
    _, _, path, _ = written
    from vkspec.config import from_dict
    from vkspec.gguf_file import GgufFile
    from vkspec.loader import Loader
    f = GgufFile(path)
    blob = f.g.tensor_bytes("blk.2.ffn_up_exps.weight")
    experts = Loader(from_dict(f.config_dict()), f, "f32").load(False).layers[2].ffn.experts
    for e, ex in enumerate(experts):
        assert np.shares_memory(ex.up.data, blob) and ex.up.order is None
        assert ex.up.data.tobytes() == blob.reshape(4, -1)[e].tobytes()


def test_gguf_matches_transformers_loading_it(written):
    _, d, path, _ = written
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=path.name, dtype=torch.float32).eval()
    model = load_model(path)
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT]), use_cache=False).logits[0].numpy()
        ids = hf.generate(torch.tensor([PROMPT[:5]]), max_new_tokens=24, do_sample=False,
                          min_new_tokens=24, pad_token_id=0)[0, 5:].tolist()
    _, got = model.forward(PROMPT, model.new_state())
    assert np.abs(got - want).max() < LOGIT_TOL
    assert generate(model, PROMPT[:5], 24).tokens == ids


# --- qwen3next ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    d = make_tiny(tmp_path_factory.mktemp("hybrid"), seed=3, mtp=True, experts=4)
    return d, {mtp: write_qwen3next_gguf(d, d / f"qwen3next-mtp{int(mtp)}.gguf", mtp) for mtp in (False, True)}


def hybrid_run(model, steps=4):
    """Bytes of two prefill blocks, decode steps, and the MTP head (when the
    model has one) on every step's row and on a block of rows."""
    st, out = model.new_state(), []
    toks = PROMPT[:13]
    for i in range(0, len(toks), 8):
        h, lg = model.forward(toks[i:i + 8], st)
        out += [h.tobytes(), lg.tobytes()]
    if model.has_mtp:
        out += [a.tobytes() for a in model.mtp_forward(h[:-1], toks[9:13], st, np.arange(9, 13))]
    for _ in range(steps):
        tok = int(np.argmax(lg[-1]))
        h, lg = model.forward([tok], st)
        out += [h.tobytes(), lg.tobytes()]
        if model.has_mtp:
            out += [a.tobytes() for a in model.mtp_forward(h, [tok], st, [st.kv_len])]
    return out


def test_qwen3next_gguf_config(hybrid):
    d, paths = hybrid
    for mtp, path in paths.items():
        m = load_model(path)
        c, want = m.cfg, load_model(d, mtp=mtp).cfg
        assert m.has_mtp == mtp and c.num_hidden_layers == want.num_hidden_layers == 4
        assert c.layer_types == want.layer_types and c.rotary_dim == want.rotary_dim
        assert not c.norm_plus_one and want.norm_plus_one            # stored 1 + w: never twice
        for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                  "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"):
            assert getattr(c, k) == getattr(want, k), k


@pytest.mark.parametrize("mtp", [False, True])
def test_qwen3next_gguf_equals_the_safetensors_run(hybrid, mtp):
    d, paths = hybrid
    assert hybrid_run(load_model(paths[mtp])) == hybrid_run(load_model(d, mtp=mtp))


def test_qwen3next_mtp_file_beside_the_model(hybrid, tmp_path):
    """convert_hf_to_gguf.py --no-mtp and --mtp: the head from mtp-<name>.gguf."""
    d, paths = hybrid
    write_qwen3next_gguf(d, tmp_path / "mtp-model.gguf", True, only=True)
    (tmp_path / "model.gguf").symlink_to(paths[False])
    model = load_model(tmp_path / "model.gguf")
    assert model.has_mtp and hybrid_run(model) == hybrid_run(load_model(d, mtp=True))


@pytest.mark.parametrize("mtp", [False, True])
def test_qwen3next_gguf_on_the_device(hybrid, mtp, vk):
    d, paths = hybrid
    dev = load_model(paths[mtp], backend="vulkan")
    want = hybrid_run(load_model(d, mtp=mtp))
    got = hybrid_run(dev)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a == b, "device and CPU differ"


# --- refusals -----------------------------------------------------------------------------

def _meta_only(path, arch, **extra):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_feed_forward_length(96)
    for k, v in extra.items():
        getattr(w, f"add_{k}")(v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch,extra,why", [
    ("mamba9", {}, "architecture 'mamba9' is not supported"),
    ("qwen3", {"rope_scaling_type": gguf.RopeScalingType.YARN}, "rope.scaling.type 'yarn' is not supported"),
    ("qwen3", {"key_length": 16, "value_length": 32}, "value_length 32 != key_length 16"),
])
def test_what_is_not_implemented_is_refused_in_one_line(tmp_path, arch, extra, why):
    path = _meta_only(tmp_path / "m.gguf", arch, **extra)
    with pytest.raises(VkspecError) as e:
        load_model(path)
    msg = str(e.value)
    assert why in msg and "\n" not in msg and str(path) in msg, msg
