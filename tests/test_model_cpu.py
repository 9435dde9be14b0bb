"""The hybrid model on the exact CPU path: bits, formats, the MTP head, sampling."""

import hashlib

import numpy as np
import pytest

from vkspec.backends.cpu import jit as cpu_jit
from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.sampling import Sampler
from vkspec.tiny import make_tiny


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"), seed=1, mtp=True, experts=4)


def state_bytes(st):
    h = hashlib.sha256()
    for a in [*st.kv_k, *st.kv_v, *st.conv, *st.ssm]:
        h.update(a.tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("fmt", ["f32", "int8", "int4-g64"])
def test_block_equals_rows(tiny_dir, fmt):
    """A block of n rows on a non-empty state gives each row the bits of feeding it alone."""
    model = load_model(tiny_dir, fmt=fmt)
    toks = [5, 9, 14, 200, 33, 7, 7, 81, 150, 3, 44, 19]
    a, b = model.new_state(), model.new_state()
    model.forward(toks[:3], a)
    model.forward(toks[:3], b)
    ha, la = model.forward(toks[3:10], a)                  # one 7-row block
    rows = [model.forward([t], b) for t in toks[3:10]]     # seven single rows
    assert la.tobytes() == np.concatenate([r[1] for r in rows]).tobytes()
    assert ha.tobytes() == np.concatenate([r[0] for r in rows]).tobytes()
    assert a.kv_len == b.kv_len and state_bytes(a) == state_bytes(b)


@pytest.mark.parametrize("fmt,dense", [("f32", False), ("int4-g64", False), ("int4-g64", True)])
def test_compiled_path_is_the_numpy_definition(tiny_dir, fmt, dense, monkeypatch, tmp_path):
    """The whole model, trunk and MTP head, with the numba kernels and under
    cpu_jit.ENABLED off (VKSPEC_CPU_JIT=0: exact.py alone): the same logits,
    hidden states and state; dense: MLPs, not experts (the compiled GEMV
    runs the input norms and the MLP's activation in its own call)."""
    toks = [5, 9, 14, 200, 33, 7, 7, 81]
    path = make_tiny(tmp_path / "dense", seed=2, mtp=True, experts=0) if dense else tiny_dir
    runs = []
    for jit in ("1", "0"):
        monkeypatch.setattr(cpu_jit, "ENABLED", jit == "1")
        model = load_model(path, fmt=fmt)
        st = model.new_state()
        h1, l1 = model.forward(toks[:5], st)
        h2, l2 = model.forward(toks[5:], st, copies=True)
        mh, ml = model.mtp_forward(np.concatenate([h1, h2])[:-1], toks[1:], st, np.arange(1, len(toks)))
        runs.append((h1.tobytes() + l1.tobytes() + h2.tobytes() + l2.tobytes() + mh.tobytes()
                     + ml.tobytes(), state_bytes(st)))
    assert runs[0] == runs[1]


def test_mtp_absorb_rows_write_what_a_full_pass_writes(tiny_dir):
    """mtp_forward(logits_rows="last"): the rows before the last only write
    their KV rows; the cache and the last row's outputs equal a full pass's."""
    model = load_model(tiny_dir)
    toks = [5, 9, 14, 200, 33, 7, 7, 81]
    st = model.new_state()
    hidden, _ = model.forward(toks, st)
    a, b = model.snapshot(st), model.snapshot(st)
    full = model.mtp_forward(hidden[:-1], toks[1:], a, np.arange(1, len(toks)))
    last = model.mtp_forward(hidden[:-1], toks[1:], b, np.arange(1, len(toks)), logits_rows="last")
    assert last[0].shape == (1, full[0].shape[1]) and last[1].shape == (1, full[1].shape[1])
    assert last[0].tobytes() == full[0][-1:].tobytes() and last[1].tobytes() == full[1][-1:].tobytes()
    assert a.mtp_k.tobytes() == b.mtp_k.tobytes() and a.mtp_v.tobytes() == b.mtp_v.tobytes()
    assert np.abs(b.mtp_k[1:len(toks)]).sum() > 0


def test_prefill_block_size_does_not_change_output(tiny_dir):
    model = load_model(tiny_dir)
    prompt = list(range(1, 40))
    outs = {blk: generate(model, prompt, 8, block=blk) for blk in (1, 7, 32)}
    assert len({r.digest for r in outs.values()}) == 1


def test_quantised_weights_are_within_half_a_step_of_f32():
    """int8 (a scale per row) and int4-g64 (a scale per 64 columns): every
    weight is within half a quantisation step of its f32 value, the step
    being scale = amax / 127 or amax / 7 of its row or group."""
    from vkspec.formats.matrix import dequantize, f32
    from vkspec.formats.quant import quantize
    w = np.random.default_rng(0).standard_normal((48, 200)).astype(np.float32) * 3
    w[5] = 0.0                                                   # an all-zero row keeps scale 1, values 0
    for fmt, group, levels in (("int8", 200, 127), ("int4-g64", 64, 7)):
        q = quantize(f32(w), fmt)
        got = dequantize(q)
        wp = np.zeros((48, -(-200 // group) * group), np.float32)
        wp[:, :200] = w
        amax = np.abs(wp.reshape(48, -1, group)).max(axis=2)
        step = np.repeat(np.where(amax > 0, amax / levels, 1.0), group, axis=1)[:, :200]
        err = np.abs(got.astype(np.float64) - w)
        assert (err <= 0.5 * step * (1 + 1e-6) + 1e-30).all(), (fmt, float((err / step).max()))
        assert (got[5] == 0).all()


def test_trained_model_keeps_its_logits_under_int8(tiny_dir):
    """On the bundled trained model (a real network, where a random one
    amplifies any error), int8 keeps the logits within 10% and the greedy ids."""
    from pathlib import Path
    d = Path(__file__).resolve().parents[1] / "models" / "tiny-hybrid"
    prompt = [int(t) for t in np.random.default_rng(0).integers(1, 4000, 24)]
    base = load_model(d, mtp=False)
    b = base.forward(prompt, base.new_state())[1]
    m = load_model(d, fmt="int8", mtp=False)
    got = m.forward(prompt, m.new_state())[1]
    assert np.abs(got - b).mean() / np.abs(b).mean() < 0.1
    assert (got.argmax(1) == b.argmax(1)).all()


@pytest.mark.oracle
def test_mtp_head_is_the_written_out_formula(tiny_dir):
    """fc(cat[norm_emb(embed(t+1)), norm_hidden(h_t)]) -> decoder layer -> norm -> lm_head,
    written here with transformers' own Qwen3-Next decoder layer and torch ops."""
    from conftest import require
    torch = require("torch")
    from safetensors.numpy import load_file
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        Qwen3NextDecoderLayer, Qwen3NextRotaryEmbedding)
    import json
    model = load_model(tiny_dir)
    raw = {k: torch.from_numpy(v.copy()) for k, v in load_file(str(tiny_dir / "model.safetensors")).items()}
    cfgd = json.loads((tiny_dir / "config.json").read_text())
    cfgd["layer_types"] = ["full_attention"]
    cfgd["num_hidden_layers"] = 1
    cfg = Qwen3NextConfig(**{k: v for k, v in cfgd.items() if k not in ("architectures", "model_type")})
    layer = Qwen3NextDecoderLayer(cfg, 0).float().eval()
    sd = {k[len("mtp.layers.0."):]: v for k, v in raw.items()
          if k.startswith("mtp.layers.0.") and ".experts." not in k}
    e = range(cfg.num_experts)
    ex = "mtp.layers.0.mlp.experts"
    sd["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([raw[f"{ex}.{i}.gate_proj.weight"], raw[f"{ex}.{i}.up_proj.weight"]]) for i in e])
    sd["mlp.experts.down_proj"] = torch.stack([raw[f"{ex}.{i}.down_proj.weight"] for i in e])
    layer.load_state_dict(sd)
    rot = Qwen3NextRotaryEmbedding(cfg)

    def rms(x, w, eps=1e-6):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)

    st = model.new_state()
    toks = [5, 9, 14, 200, 33, 7]
    hidden, _ = model.forward(toks, st)
    # rows: (h_t, token t+1) for t = 0..4, written at the head's cache rows 0..4
    h_t, nxt, pos = hidden[:5], toks[1:], np.arange(0, 5)
    _, got = model.mtp_forward(h_t, nxt, st, pos)
    with torch.no_grad():
        e = rms(raw["model.embed_tokens.weight"][nxt], raw["mtp.pre_fc_norm_embedding.weight"])
        hh = rms(torch.from_numpy(h_t), raw["mtp.pre_fc_norm_hidden.weight"])
        x = torch.cat([e, hh], -1) @ raw["mtp.fc.weight"].T
        x = x[None]
        pos_ids = torch.from_numpy(pos)[None]
        mask = torch.full((5, 5), float("-inf")).triu(1)[None, None]
        x = layer(x, position_embeddings=rot(x, pos_ids), attention_mask=mask, position_ids=pos_ids)
        x = x[0] if isinstance(x, tuple) else x
        want = rms(x[0], raw["mtp.norm.weight"]) @ raw["lm_head.weight"].T
    assert got.shape == want.shape
    assert np.abs(got - want.numpy()).max() < 1e-4


def test_seeded_sampling_is_reproducible_and_draws_once_per_token(tiny_dir):
    model = load_model(tiny_dir)
    runs = [generate(model, [5, 9, 14], 24, Sampler(temperature=0.8, top_p=0.9, seed=7)) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens
    s = Sampler(temperature=0.8, seed=7)
    generate(model, [5, 9, 14], 24, s)
    assert s.draws == 24
    other = generate(model, [5, 9, 14], 24, Sampler(temperature=0.8, seed=8)).tokens
    assert other != runs[0].tokens


def test_top_k_one_is_greedy(tiny_dir):
    model = load_model(tiny_dir)
    a = generate(model, [5, 9, 14], 16).tokens
    b = generate(model, [5, 9, 14], 16, Sampler(temperature=1.0, top_k=1, seed=3)).tokens
    assert a == b


HEAP_ROUNDS = """
import resource, sys
import numpy as np
from vkspec.backends.cpu import heap
print(heap.keep_scratch())
def block():                                   # a prefill call's temporaries: six 4.7 MB arrays, touched, freed
    arrs = [np.ones((1200, 1024), np.float32) for _ in range(6)]
    del arrs
block()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    block()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_a_forwards_scratch_is_not_faulted_in_again_every_call():
    """heap.keep_scratch (every CPU model): temporaries freed at the end of a
    call stay in the heap for the next one. glibc's default gives them back
    to the kernel and faults them in again, zeroed (about 9,000 faults for
    these three rounds; a 186-token prefill at 1.7B widths took 130,000)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", HEAP_ROUNDS], capture_output=True, text=True, check=True).stdout.split()
    if out[0] != "True":
        pytest.skip("this C library has no mallopt (not glibc)")
    assert int(out[1]) < 500


def test_a_kv_cache_is_resident_only_where_written(tiny_dir):
    """CpuModel's KV caches (sized for the whole context) are pages of their
    own, resident once written, whatever malloc does with freed memory:
    from the heap, where heap.keep_scratch puts blocks under 32 MB, the
    1.7B-width file's caches raised peak RSS from 1.26 to 2.04 GB at a
    4096-token context."""
    import mmap
    import subprocess
    import sys
    model = load_model(tiny_dir, fmt="int8")
    st = model.new_state()
    for a in st.kv_k + st.kv_v:
        base = a
        while isinstance(base, (np.ndarray, memoryview)):
            base = base.base if isinstance(base, np.ndarray) else base.obj
        assert isinstance(base, mmap.mmap)
    rounds = """
import numpy as np
from vkspec.backends.cpu import heap
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096
before = rss()
kv = [heap.kv_cache(4096, 8, 128) for _ in range(8)]        # 128 MB
for a in kv: a[7] = 1.0                                     # one row each (a page per head)
print(rss() - before, all(a.flags.writeable and not a[8:].any() for a in kv))
"""
    grew, ok = subprocess.run([sys.executable, "-c", rounds], capture_output=True, text=True, check=True).stdout.split()
    assert ok == "True" and int(grew) < 4 << 20


def test_a_kv_cache_holds_each_heads_rows_together(tiny_dir):
    """The CPU state's KV caches, live and snapshot, are (rows, nkv, hd)
    views of head-first memory, which the compiled attention reads in place
    (a head's keys streamed in order: docs/performance.md); it refuses to
    write a cache of any other layout, which it could only write as a copy."""
    from vkspec.backends.cpu import heap
    model = load_model(tiny_dir)
    st = model.new_state()
    model.forward([5, 9, 14], st)
    snap = model.snapshot(st)
    for a in st.kv_k + st.kv_v + [st.mtp_k, st.mtp_v] + snap.kv_k + snap.kv_v + [snap.mtp_k, snap.mtp_v]:
        assert heap.heads_first(a, writable=True).base is not None
        assert np.shares_memory(heap.heads_first(a, writable=True), a)
    assert snap.kv_k[0].tobytes() == st.kv_k[0][:3].tobytes()
    with pytest.raises(ValueError, match="heap.kv_cache"):
        heap.heads_first(np.zeros((8, 2, 4), np.float32), writable=True)
