"""GGUF qwen35 / qwen35moe (Qwen3.5 / Qwen3.6, dense and routed + shared
experts) with the MTP head, as llama.cpp's converter writes them: tiny
transformers qwen3_5 / qwen3_5_moe checkpoints with random mtp.* tensors,
written by tests/qwen35_models.py with the gguf package under the converter's
conventions (scripts/check_qwen35_converter.py holds those files equal to the
converter's own, where llama.cpp's source tree is at hand).

vkspec's run of the GGUF equals its run of the safetensors byte for byte
(hidden rows, logits, MTP head outputs; greedy ids and the run digest, with
and without MTP drafts), on the CPU and on the device. The tiny models have 2
key heads and 4 value heads, so the converter's tiled value heads are in
every DeltaNet tensor.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import require

require("torch")
require("transformers")
pytestmark = pytest.mark.oracle
gguf = require("gguf")

import qwen35_models as q  # noqa: E402
from test_families_gguf import PROMPT, hybrid_run  # noqa: E402

from vkspec import family_qwen35  # noqa: E402
from vkspec.errors import VkspecError  # noqa: E402
from vkspec.loader import load_model  # noqa: E402
from vkspec.sampling import Sampler  # noqa: E402
from vkspec.speculative import SpecConfig, generate, generate_spec  # noqa: E402
from vkspec.speculative.sources import build as build_sources  # noqa: E402

N = 24


@pytest.fixture(scope="module", params=sorted(q.ARCH))
def files(request, tmp_path_factory):
    """{"st": the safetensors folder, "with": the GGUF with its MTP block,
    "split": a --no-mtp GGUF with the --mtp file beside it, "alone": a --no-mtp
    GGUF by itself, "mtp": the MTP file}."""
    d = tmp_path_factory.mktemp(request.param)
    st = q.checkpoint(request.param, d / "st")
    for sub in ("split", "alone"):
        (d / sub).mkdir()
    out = {"st": st, "with": q.write(st, d / "model.gguf"),
           "split": q.write(st, d / "split" / "model.gguf", "none"),
           "mtp": q.write(st, d / "split" / "mtp-model.gguf", "only"),
           "alone": q.write(st, d / "alone" / "model.gguf", "none")}
    out["arch"] = q.ARCH[request.param]
    return out


def test_config_reads_the_arch(files):
    c, want = load_model(files["with"]).cfg, load_model(files["st"]).cfg
    assert c.model_type == json.loads((files["st"] / "config.json").read_text())["model_type"]
    assert not c.norm_plus_one and want.norm_plus_one                 # stored 1 + w: never twice
    for k in ("num_hidden_layers", "layer_types", "rotary_dim", "head_dim", "attn_gate", "qk_norm",
              "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
              "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
              "intermediate_size", "vocab_size", "tie_word_embeddings"):
        assert getattr(c, k) == getattr(want, k), k
    assert c.num_experts == (4 if files["arch"] == "qwen35moe" else 0)


@pytest.mark.parametrize("mtp", [False, True])
def test_gguf_run_equals_the_safetensors_run(files, mtp):
    model = load_model(files["with"], mtp=mtp)
    assert model.has_mtp == mtp
    assert hybrid_run(model) == hybrid_run(load_model(files["st"], mtp=mtp))


def spec_run(model, prompt=PROMPT[:9]):
    cfg = SpecConfig(spec_mode="mtp", spec_draft_max=3, spec_gate=False).check()
    sources, gate = build_sources(model, cfg)
    return generate_spec(model, prompt, N, Sampler(), sources, gate, snapshots=cfg.spec_mtp_recurrent_snapshots)


def test_mtp_drafts_from_the_gguf_give_the_plain_ids_and_digest(files):
    plain = generate(load_model(files["st"], mtp=False), PROMPT[:9], N)
    model = load_model(files["with"])
    got = spec_run(model)
    assert got.counters.drafted > 0
    assert (got.tokens, got.digest) == (plain.tokens, plain.digest)
    assert (generate(model, PROMPT[:9], N).tokens, generate(model, PROMPT[:9], N).digest) == \
        (plain.tokens, plain.digest)


def test_the_mtp_file_beside_the_model_is_its_head(files):
    want = hybrid_run(load_model(files["st"], mtp=True))
    found = load_model(files["split"])
    assert found.has_mtp and hybrid_run(found) == want
    named = load_model(files["alone"], mtp_file=files["mtp"])
    assert named.has_mtp and hybrid_run(named) == want
    assert not load_model(files["alone"]).has_mtp
    other = files["alone"].parent / "mtp-other.gguf"     # another architecture's head beside it: not this one's
    q.write(q.checkpoint("qwen3_5" if files["arch"] == "qwen35moe" else "qwen3_5_moe", files["alone"].parent / "o"),
            other, "only")
    try:
        assert not load_model(files["alone"]).has_mtp
    finally:
        other.unlink()
    assert not load_model(files["split"], mtp=False).has_mtp


@pytest.mark.parametrize("mtp", [False, True])
def test_gguf_on_the_device(files, mtp, vk):
    dev = load_model(files["with"], backend="vulkan", mtp=mtp)
    want = hybrid_run(load_model(files["st"], mtp=mtp))
    got = hybrid_run(dev)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a == b, "device and CPU differ"
    if mtp:
        plain = generate(load_model(files["st"], mtp=False), PROMPT[:9], N)
        res = spec_run(dev)
        assert (res.tokens, res.digest) == (plain.tokens, plain.digest)
        assert hybrid_run(load_model(files["split"], backend="vulkan")) == want     # the head from mtp-model.gguf


def test_tiled_value_heads_are_read_back_in_grouped_order(files, monkeypatch):
    """Read as stored (tiled), the runs differ: the test above sees the order."""
    want = hybrid_run(load_model(files["st"], mtp=False))
    monkeypatch.setattr(family_qwen35.Untile, "rows", lambda self, g: None)
    monkeypatch.setattr(family_qwen35.Untile, "columns", lambda self, g: None)
    from vkspec import gguf_file
    gguf_file._OPEN.clear()
    try:
        assert hybrid_run(load_model(files["with"], mtp=False)) != want
    finally:
        gguf_file._OPEN.clear()


def test_grouped_order_undoes_the_converters_tiling():
    nk, nv, d = 2, 6, 3
    a = np.arange(nv * d * 5).reshape(nv * d, 5)
    tiled = q._tiled(a, 0, nk, nv, d)
    assert not np.array_equal(tiled, a)
    assert np.array_equal(tiled[family_qwen35.grouped_order(nk, nv, d)], a)


def test_block_columns_move_whole_blocks():
    """ssm_out's columns in a block format: whole Q8_0 blocks move, their
    bytes unchanged, when a value head spans whole blocks."""
    from gguf.quants import quantize

    from vkspec.formats.matrix import dequantize, from_array
    nk, nv, d = 2, 4, 32
    x = np.random.default_rng(0).standard_normal((3, nv * d)).astype(np.float32)
    stored = quantize(q._tiled(x, 1, nk, nv, d), gguf.GGMLQuantizationType.Q8_0)
    w = from_array(stored, "q8_0")
    got = family_qwen35.gather_columns(w.data, 32, 34, family_qwen35.grouped_order(nk, nv, d), "f", "g")
    back = dequantize(from_array(got, "q8_0"))
    assert np.array_equal(back, dequantize(w)[:, family_qwen35.grouped_order(nk, nv, d)])
    with pytest.raises(VkspecError, match="across its blocks of 32 columns"):
        family_qwen35.gather_columns(w.data, 32, 34, family_qwen35.grouped_order(nk, nv, 8), "f", "g")


# --- q8_0: ssm_out's blocks of 32 span the tiny value heads of 8 ---------------------------

def fresh(path, **kw):
    """A model of a file opened again (GgufFile is cached per process)."""
    from vkspec import gguf_file
    gguf_file._OPEN.clear()
    try:
        return load_model(path, **kw)
    finally:
        gguf_file._OPEN.clear()


def test_q8_0_file_keeps_the_tiled_heads_and_drafts_exactly(files, tmp_path):
    m = load_model(q.write(files["st"], tmp_path / "q8.gguf", outtype="q8_0"))
    assert m.cfg.linear_v_tiled and m.has_mtp
    plain, got = generate(m, PROMPT[:9], N), spec_run(m)
    assert got.counters.drafted > 0 and (got.tokens, got.digest) == (plain.tokens, plain.digest)


def test_the_tiled_forward_is_the_same_model(files, monkeypatch):
    """The F32 file read as stored, value head j on key head j % nk: the same
    model (ids; logits up to the order of ssm_out's sums), not the same bytes."""
    want = load_model(files["st"], mtp=False)
    monkeypatch.setattr(family_qwen35.Untile, "movable", lambda self, b: False)
    got = fresh(files["with"], mtp=False)
    assert got.cfg.linear_v_tiled
    _, a = got.forward(PROMPT, got.new_state())
    _, b = want.forward(PROMPT, want.new_state())
    assert a.tobytes() != b.tobytes() and np.abs(a - b).max() < 1e-4
    assert generate(got, PROMPT[:9], N).tokens == generate(want, PROMPT[:9], N).tokens


def test_q8_0_file_on_the_device(files, tmp_path, vk):
    path = q.write(files["st"], tmp_path / "q8.gguf", outtype="q8_0")
    got, want = hybrid_run(load_model(path, backend="vulkan")), hybrid_run(load_model(path))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a == b, "device and CPU differ"


# --- bad input ----------------------------------------------------------------------------

def one_line(path, why, **kw):
    from vkspec import gguf_file
    gguf_file._OPEN.clear()
    with pytest.raises(VkspecError) as e:
        load_model(path, **kw)
    msg = str(e.value)
    assert why in msg and "\n" not in msg, msg


@pytest.mark.parametrize("files", ["qwen3_5_moe"], indirect=True)
@pytest.mark.parametrize("drop", ["blk.0.ssm_alpha.weight", "blk.3.attn_q_norm.weight", "blk.1.ffn_up_exps.weight"])
def test_a_missing_tensor_is_one_line(files, tmp_path, drop):
    path = q.write(files["st"], tmp_path / "m.gguf", drop={drop})
    one_line(path, f"missing tensor {drop}")


@pytest.mark.parametrize("files", ["qwen3_5"], indirect=True)
@pytest.mark.parametrize("extra,why", [
    (dict(extra_keys={"qwen35.rope.scaling.factor": 4}), "unknown key 'qwen35.rope.scaling.factor'"),
    (dict(extra_tensors={"blk.0.ffn_gate_up_exps.weight": np.zeros((4, 64, 64), np.float32)}),
     "unknown tensor 'blk.0.ffn_gate_up_exps.weight'"),
])
def test_an_unknown_key_or_tensor_is_one_line(files, tmp_path, extra, why):
    path = q.write(files["st"], tmp_path / "m.gguf", **extra)
    one_line(path, why)


@pytest.mark.parametrize("files", ["qwen3_5"], indirect=True)
def test_another_models_mtp_file_is_one_line(files, tmp_path):
    other = q.checkpoint("qwen3_5_moe", tmp_path / "moe")
    one_line(files["alone"], "an MTP file of a qwen35moe model", mtp_file=q.write(other, tmp_path / "o.gguf", "only"))
    one_line(files["alone"], "not an MTP file", mtp_file=files["alone"])
    one_line(files["alone"], "the checkpoint has no MTP head", mtp=True)


@pytest.mark.parametrize("files", ["qwen3_5"], indirect=True)
def test_cli_run_takes_mtp_file_and_says_once_when_there_is_none(files):
    def run(*args):
        r = subprocess.run([sys.executable, "-m", "vkspec.cli", "run", str(files["alone"]), "--prompt-ids",
                            ",".join(map(str, PROMPT[:9])), "-n", "12", "--json", *args],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)
    plain = run("--spec", "off")
    r = subprocess.run([sys.executable, "-m", "vkspec.cli", "run", str(files["alone"]), "--prompt-ids", "3,4",
                        "-n", "2", "--spec", "auto"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.count("no MTP head") == 1, r.stderr
    drafted = run("--spec", "mtp", "--no-gate", "--mtp-file", str(files["mtp"]))
    assert (drafted["tokens"], drafted["digest"]) == (plain["tokens"], plain["digest"])
    assert drafted["drafted"] > 0
    r = subprocess.run([sys.executable, "-m", "vkspec.cli", "plan", str(files["alone"]), "--json", "--mtp-file",
                        str(files["mtp"])], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["mtp_head"] > 0, r.stderr
