"""Bad model files through the command line: each is one line naming the
file (and the tensor or key), exit status 2, no traceback, the file
untouched. And a model one past each fixed array of the shaders is refused
before the device computes garbage."""

import hashlib
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from vkspec.tiny import make_tiny


def tiny_llama_gguf(path, heads=2, arch="llama"):
    """A 1-layer llama GGUF the loader accepts (hidden 8, vocab 16)."""
    import gguf
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(16)
    t = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", t(16, 8))
    w.add_tensor("output_norm.weight", t(8))
    for name, shape in (("attn_norm", (8,)), ("ffn_norm", (8,)), ("attn_q", (8, 8)), ("attn_k", (8, 8)),
                        ("attn_v", (8, 8)), ("attn_output", (8, 8)), ("ffn_gate", (8, 8)), ("ffn_up", (8, 8)),
                        ("ffn_down", (8, 8))):
        w.add_tensor(f"blk.0.{name}.weight", t(*shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def run(path, *extra):
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", "run", str(path), "--prompt-ids", "1,2", "-n", "1",
                          *extra], capture_output=True, text=True, env=os.environ, timeout=300)
    return res


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def assert_one_line(path, res, *words):
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert str(path) in res.stderr or os.path.basename(str(path)) in res.stderr, res.stderr
    for w in words:
        assert w in res.stderr, (w, res.stderr)


def test_a_good_tiny_gguf_runs(tmp_path):
    res = run(tiny_llama_gguf(tmp_path / "ok.gguf"), "--json")
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)["tokens"]) == 1


def _tensor_info_offset(raw: bytes, name: bytes) -> int:
    """The byte offset of a tensor's info record (its name) in the header."""
    return raw.index(struct.pack("<Q", len(name)) + name)


@pytest.mark.parametrize("case", ["size", "type", "truncated", "count", "arch", "heads"])
def test_bad_gguf_is_one_line_and_the_file_is_untouched(tmp_path, case):
    good = tiny_llama_gguf(tmp_path / "good.gguf", arch="qwen9" if case == "arch" else "llama",
                           heads=0 if case == "heads" else 2)
    raw = bytearray(good.read_bytes())
    words = []
    if case == "size":            # a dimension that makes the tensor larger than its bytes
        at = _tensor_info_offset(raw, b"blk.0.attn_q.weight") + 8 + len(b"blk.0.attn_q.weight") + 4
        raw[at:at + 8] = struct.pack("<Q", 9)
        words = ["blk.0.attn_q.weight"]
    elif case == "type":          # an unknown ggml type
        name = b"blk.0.attn_v.weight"
        at = _tensor_info_offset(raw, name) + 8 + len(name)
        n_dims = struct.unpack_from("<I", raw, at)[0]
        raw[at + 4 + 8 * n_dims:at + 8 + 8 * n_dims] = struct.pack("<I", 99)
        words = ["blk.0.attn_v.weight"]
    elif case == "truncated":
        raw = raw[:len(raw) - 40]
    elif case == "count":         # a metadata array claiming 2**40 entries
        key = b"tokenizer.ggml.tokens"
        if key not in raw:        # the tiny file has none: make a count absurd instead (tensor count)
            raw[16:24] = struct.pack("<Q", 1 << 40)
    elif case == "arch":
        words = ["qwen9"]
    elif case == "heads":
        words = ["head"]
    bad = tmp_path / f"bad-{case}.gguf"
    bad.write_bytes(bytes(raw))
    before = digest(bad)
    assert_one_line(bad, run(bad), *words)
    assert digest(bad) == before


@pytest.mark.parametrize("what,value", [("linear_conv_kernel_dim", 9), ("linear_key_head_dim", 260),
                                        ("num_experts", 513), ("num_experts_per_tok", 17)])
def test_a_model_past_a_shader_limit_is_refused_on_the_device(vk, tmp_path, what, value):
    """One past conv_step's MAX_K, deltanet's MAX_DK, route's MAX_E / MAX_K
    (vkspec/shaders/limits.py): the device refuses with one line, the CPU runs it."""
    from vkspec.loader import load_model
    from vkspec.errors import VkspecError
    kw = dict(experts=4, top_k=2, hidden=32, layers=4, vocab=64)
    d = make_tiny(tmp_path / what, seed=1, **kw)
    cfg = json.loads((d / "config.json").read_text())
    cfg[what] = value
    if what == "num_experts_per_tok":
        cfg["num_experts"] = 20
    (d / "config.json").write_text(json.dumps(cfg))
    from safetensors.numpy import save_file
    from vkspec.tiny import random_weights
    save_file(random_weights(cfg, 1), str(d / "model.safetensors"))          # weights of the new shapes
    with pytest.raises(VkspecError, match=f"{what} = {value} is over the device's limit"):
        load_model(d, backend="vulkan")
    load_model(d)                                            # the CPU has no such limit
