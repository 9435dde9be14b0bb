"""The Vulkan dense chain against the NumPy path, byte for byte: prefill
blocks, decode steps, verify blocks, the MTP head, rollback, copy slots."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import bits_equal
from vkspec.errors import VkspecError
from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.tiny import make_tiny

# "bf16": a BF16 checkpoint: both backends keep its weights as bf16. int8 and
# int4-g64 take q8 activations (the default); "int8/f32" the f32 reference
FORMATS = ["f32", "int8", "int4-g64", "bf16", "int8/f32"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"), seed=3, mtp=True, experts=4)


@pytest.fixture(scope="module")
def pairs(vk, tiny_dir, tmp_path_factory):
    """(cpu, vulkan) models per format, built once (pipelines are slow to make)."""
    cache = {}
    bf16_dir = make_tiny(tmp_path_factory.mktemp("tiny_bf16"), seed=3, mtp=True, experts=4, bf16=True)

    def get(fmt, mtp=True):
        if (fmt, mtp) not in cache:
            d, f = (bf16_dir, "f32") if fmt == "bf16" else (tiny_dir, fmt)
            f, _, acts = f.partition("/")
            acts = acts or "q8"
            cache[fmt, mtp] = (load_model(d, fmt=f, mtp=mtp, activations=acts),
                               load_model(d, fmt=f, mtp=mtp, backend="vulkan", activations=acts))
            vk, kept = cache[fmt, mtp][1], ("bf16" if fmt == "bf16" else f)
            parts = [p for L in vk.b.layers for w in (L.mix, L.out, L.ffn.gate_up, L.ffn.down) for p in w.parts]
            assert {p.fmt for p in parts} == {kept}
            q8 = f in ("int8", "int4-g64") and acts == "q8"      # (a matrix whose width is no whole block: f32)
            assert ("q8" in {p.acts for p in parts}) == q8
            assert {p.fmt for p in vk.b.head.parts} == {kept}
        return cache[fmt, mtp]
    return get


def prompt(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(1, 512, n)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_prefill_decode_and_mtp_bits(pairs, fmt):
    """103-token prompt in 8-row blocks (all rows' logits), 64 greedy decode
    steps, and the MTP head every 8 steps: hidden and logits byte for byte."""
    cpu, vk = pairs(fmt)
    sc, sv = cpu.new_state(), vk.new_state()
    toks = prompt(103)
    for i in range(0, len(toks), 8):
        hc, lc = cpu.forward(toks[i:i + 8], sc)
        hv, lv = vk.forward(toks[i:i + 8], sv)
        bits_equal(hv, hc)
        bits_equal(lv, lc)
    for step in range(64):
        tok = int(np.argmax(lc[-1]))
        assert vk.last_picks[-1] == tok, (vk.last_picks, np.argmax(lc, axis=1), np.argmax(lv, axis=1))
        hc, lc = cpu.forward([tok], sc)
        hv, lv = vk.forward([tok], sv)
        bits_equal(hv, hc)
        bits_equal(lv, lc)
        if step % 8 == 0:
            nxt = int(np.argmax(lc[-1]))
            mc = cpu.mtp_forward(hc, [nxt], sc, [sc.kv_len])
            mv = vk.mtp_forward(hv, [nxt], sv, [sv.kv_len])
            bits_equal(mv[0], mc[0])
            bits_equal(mv[1], mc[1])
    assert sv.kv_len == sc.kv_len == 167
    # the head absorbing a block (only the last row's pass read, the rest write KV rows)
    pos = np.arange(sc.kv_len - 5, sc.kv_len)
    toks5 = prompt(5, seed=9)
    mc = cpu.mtp_forward(np.tile(hc, (5, 1)), toks5, sc, pos, logits_rows="last")
    mv = vk.mtp_forward(np.tile(hv, (5, 1)), toks5, sv, pos, logits_rows="last")
    bits_equal(mv[0], mc[0])
    bits_equal(mv[1], mc[1])
    kc, kv = cpu.snapshot(sc), vk.snapshot(sv)
    bits_equal(kv.mtp_k[:sc.kv_len], kc.mtp_k[:sc.kv_len])
    bits_equal(kv.mtp_v[:sc.kv_len], kc.mtp_v[:sc.kv_len])
    # a draft vocabulary: the lm_head reads only the listed rows (lists of
    # several device lengths, and one the device already holds)
    V, rng = cpu.cfg.vocab_size, np.random.default_rng(5)
    lists = [np.sort(rng.choice(V, k, replace=False)) for k in (1, 7, 100, V - 3, V)]
    vk.listed_step = 64                   # device lengths 64, 64, 128, V, V
    for ids in lists + lists[1:2]:
        pos = [sc.kv_len - 1]
        mc = cpu.mtp_forward(hc, [toks5[0]], sc, pos, ids=ids)
        mv = vk.mtp_forward(hv, [toks5[0]], sv, pos, ids=ids)
        whole = cpu.mtp_forward(hc, [toks5[0]], sc, pos)[1]
        assert mc[1].shape == (1, len(ids))
        bits_equal(mc[1], whole[:, ids])
        bits_equal(mv[0], mc[0])
        bits_equal(mv[1], mc[1])
        assert vk.last_mtp_picks[0] == ids[int(np.argmax(mc[1][0]))]
    with pytest.raises(VkspecError, match="out of range"):
        vk.mtp_forward(hv, [toks5[0]], sv, [sc.kv_len - 1], ids=np.array([0, V]))
    del vk.listed_step


def test_warm_records_every_decoding_shape_up_to_a_length(pairs):
    """warm(200, copies=7) records 1..8 rows of the trunk and the head for the
    context buckets 64, 128 and 256 with 7 copy slots; decoding at context
    ~150 then records nothing."""
    _, vk = pairs("f32")
    vk.warm(200, copies=7)
    before = vk.recordings
    vk.warm(200, copies=7)
    assert vk.recordings == before
    st = vk.new_state()
    for i in range(0, 144, 8):
        vk.forward(prompt(8, seed=i), st)
    at = vk.recordings
    for n in (1, 3, 8):
        vk.forward(prompt(n), st, copies=True)
        vk.rewind(st, 0)
    vk.mtp_forward(np.zeros((3, vk.cfg.hidden_size), np.float32), [1, 2, 3], st, [150, 151, 152],
                   logits_rows="last")
    assert vk.recordings == at
    # a head that scores a draft vocabulary of ~100 ids: its shapes too
    vk.warm(200, copies=7, listed=100)
    at = vk.recordings
    vk.mtp_forward(np.zeros((3, vk.cfg.hidden_size), np.float32), [1, 2, 3], st, [150, 151, 152],
                   logits_rows="last", ids=np.arange(0, 300, 3))
    assert vk.recordings == at


@pytest.mark.parametrize("n_prompt", [1, 7, 100])
@pytest.mark.parametrize("fmt", FORMATS)
def test_generate_digest(pairs, fmt, n_prompt):
    cpu, vk = pairs(fmt, mtp=False)
    rc = generate(cpu, prompt(n_prompt, seed=n_prompt), 64)
    rv = generate(vk, prompt(n_prompt, seed=n_prompt), 64)
    assert rv.tokens == rc.tokens
    assert rv.digest == rc.digest


@pytest.mark.parametrize("k", [1, 3, 7])
def test_verify_block_rows_have_decode_step_bits(pairs, k):
    """A k+1-row block on the device (with copy slots) equals k+1 single-row
    decode steps on the CPU, row for row."""
    cpu, vk = pairs("int8")
    toks = prompt(20 + k + 1, seed=k)
    sv, sc = vk.new_state(), cpu.new_state()
    for i in range(0, 20, 8):
        vk.forward(toks[i:min(i + 8, 20)], sv)
        cpu.forward(toks[i:min(i + 8, 20)], sc)
    hb, lb = vk.forward(toks[20:], sv, copies=True)
    rows = [cpu.forward([t], sc) for t in toks[20:]]
    bits_equal(hb, np.concatenate([r[0] for r in rows]))
    bits_equal(lb, np.concatenate([r[1] for r in rows]))


def state_equal(a, b):
    assert a.kv_len == b.kv_len
    for x, y in zip(a.kv_k + a.kv_v, b.kv_k + b.kv_v):
        bits_equal(np.asarray(x)[:a.kv_len], np.asarray(y)[:b.kv_len])
    for x, y in zip(a.conv + a.ssm, b.conv + b.ssm):
        bits_equal(x, y)


@pytest.mark.parametrize("fmt", ["f32", "int4-g64"])
def test_rollback_equals_feeding_only_the_kept_rows(pairs, fmt):
    """Forward 6 rows with copies, keep rows 0..r: the device state equals a
    run that fed only those rows (and the CPU's), and decoding goes on equal."""
    cpu, vk = pairs(fmt)
    toks = prompt(15, seed=5)
    head, block = toks[:9], toks[9:]
    def rewound(keep):
        sv, sc = vk.new_state(), cpu.new_state()
        for m, s in ((vk, sv), (cpu, sc)):
            m.forward(head[:8], s)
            m.forward(head[8:], s)
            m.forward(block, s, copies=True)
            m.rewind(s, keep)
        return sv, sc

    for keep in (1, 3, 6):
        sv, sc = rewound(keep)
        got = vk.read_state(sv)
        state_equal(got, sc)
        ref = vk.new_state()
        vk.forward(head[:8], ref)
        vk.forward(head[8:] + block[:keep], ref)
        state_equal(vk.read_state(ref), got)
        sv, sc = rewound(keep)                 # go on from the rewound state on both backends
        for t in (11, 12, 13):
            bits_equal(vk.forward([t], sv)[1], cpu.forward([t], sc)[1])


def test_watermark_host_and_device_agree(pairs):
    from vkspec.backends.vulkan.step import step_block
    _, vk = pairs("f32")
    KV_LEN = step_block().offsets["kv_len"]
    sv = vk.new_state()
    for blk in ([9], [1, 2, 3, 4, 5], [6, 7, 8]):
        before = sv.kv_len
        vk.forward(blk, sv, copies=True)
        assert int(vk.b.step.data()[KV_LEN]) == before
        assert sv.kv_len == before + len(blk)
    vk.rewind(sv, 1)                           # 9 rows stand: the watermark comes down
    assert sv.kv_len == 7
    vk.forward([10, 11], sv)                   # and the next block writes from row 7
    assert int(vk.b.step.data()[KV_LEN]) == 7 and sv.kv_len == 9


def test_copy_slot_allocation_failure_leaves_state_and_allows_retry(vk, tiny_dir):
    cpu = load_model(tiny_dir, mtp=False)
    m = load_model(tiny_dir, mtp=False, backend="vulkan")
    assert m.regions == 2                      # live + next; no copy slot until first use
    sv, sc = m.new_state(), cpu.new_state()
    m.forward([1, 2, 3], sv)
    cpu.forward([1, 2, 3], sc)
    before = m.read_state(sv)
    m.up.fail_after = 2                        # the third new tensor fails
    with pytest.raises(VkspecError, match="copy slots"):
        m.forward([4, 5, 6, 7], sv, copies=True)
    assert m.regions == 2 and sv.kv_len == 3
    state_equal(m.read_state(sv), before)
    _, lv = m.forward([4, 5, 6, 7], sv, copies=True)    # the retry allocates
    _, lc = cpu.forward([4, 5, 6, 7], sc, copies=True)
    assert m.regions == 5                      # 3 copy slots
    bits_equal(lv, lc)
    m.rewind(sv, 2)
    cpu.rewind(sc, 2)
    state_equal(m.read_state(sv), sc)


def test_budget_and_buffer_limit_fail_before_building(vk, tiny_dir, monkeypatch):
    from vkspec.backends.vulkan.device import Device

    def no_tensors(*a, **k):
        raise AssertionError("a device tensor was made before the plan was checked")
    monkeypatch.setattr(Device, "tensor", no_tensors)
    monkeypatch.setattr(Device, "zeros", no_tensors)
    with pytest.raises(VkspecError, match="over the budget of 0.000 GiB"):
        load_model(tiny_dir, backend="vulkan", device_gb=1e-4)
    # weights are split across buffers (tests/test_formats.py); the KV cache of
    # one layer is one buffer, and so are the attention scores: 8 rows x 4 heads x 1024 floats
    monkeypatch.setenv("VKSPEC_MAX_BUFFER_MB", "0.1")
    with pytest.raises(VkspecError, match=r"scratch:scores needs one 0.12 MiB device buffer, over "
                                          r"the device's largest storage buffer \(0.10 MiB"):
        load_model(tiny_dir, backend="vulkan")


@pytest.mark.oracle
@pytest.mark.parametrize("shape", ["grouped", "flat", "dense"])
def test_transformers_shapes_on_the_device(vk, shape, tmp_path):
    """The oracle's shapes (GQA/MQA, dk != dv, top-1 unnormalised, dense MLP)."""
    from conftest import require
    require("torch")
    from oracle_models import build
    build(shape, tmp_path)
    cpu, dev = load_model(tmp_path), load_model(tmp_path, backend="vulkan")
    toks = prompt(21, seed=7)
    sc, sv = cpu.new_state(), dev.new_state()
    for i in range(0, 21, 8):
        ids = [t % 101 for t in toks[i:i + 8]]
        bits_equal(dev.forward(ids, sv)[1], cpu.forward(ids, sc)[1])


def run_cli(*args):
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", *args], capture_output=True,
                         text=True, timeout=600, env=os.environ)
    return res


def test_cli_vulkan_and_cpu_print_the_same_digest(vk, tiny_dir):
    out = {}
    for backend in ("cpu", "vulkan"):
        for spec in ("off", "auto"):
            res = run_cli("run", str(tiny_dir), "--prompt", "def fibonacci(n):", "-n", "40",
                          "--backend", backend, "--dtype", "int8", "--spec", spec, "--json")
            assert res.returncode == 0, res.stderr
            out[backend, spec] = json.loads(res.stdout)
    assert len({r["digest"] for r in out.values()}) == 1
    assert len({tuple(r["tokens"]) for r in out.values()}) == 1
    # a device run records its step shapes before it is timed, a speculative
    # one every row count (and so takes longer); the CPU prepares its kernels
    assert out["vulkan", "auto"]["warm_s"] > out["vulkan", "off"]["warm_s"] > 0
    assert out["cpu", "auto"]["warm_s"] >= 0


def test_cli_drafts_by_default_and_the_tokens_are_off_s():
    """No --spec: auto (lookup and the MTP head under the gate) drafts, and the
    tokens and digest are --spec off's (a default of off fails the first
    assertion, drafts that changed a token the second). The bundled trained
    hybrid: a random one's drafts are rarely accepted."""
    tiny_dir = Path(__file__).resolve().parents[1] / "models" / "tiny-hybrid"
    prompt = "import os\nimport sys\n\n\ndef main(argv):\n    parser = "
    runs = {}
    for extra in ((), ("--spec", "off")):
        res = run_cli("run", str(tiny_dir), "--prompt", prompt, "-n", "48", "--json", *extra)
        assert res.returncode == 0, res.stderr
        runs[extra] = json.loads(res.stdout)
    auto, off = runs[()], runs[("--spec", "off")]
    assert auto["spec_mode"] == "auto" and auto["drafted"] > 0 and auto["forwards"] < off["forwards"]
    assert (auto["tokens"], auto["digest"]) == (off["tokens"], off["digest"])


def test_cli_device_budget_is_one_line(vk, tiny_dir):
    res = run_cli("run", str(tiny_dir), "--prompt-ids", "1,2", "--backend", "vulkan",
                  "--device-gb", "0.0001")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "over the budget" in res.stderr


def test_a_wider_model(vk, tmp_path):
    """Wider than the tiny default (more experts, heads, vocabulary): the same bits."""
    d = make_tiny(tmp_path, seed=9, mtp=True, hidden=192, vocab=2048, experts=8, top_k=2, heads=6,
                  kv_heads=2, head_dim=32, dk=32, dv=32, inter=256, moe_inter=64, shared=128)
    cpu, dev = load_model(d, fmt="int8"), load_model(d, fmt="int8", backend="vulkan")
    rc, rv = generate(cpu, prompt(19, seed=4), 24), generate(dev, prompt(19, seed=4), 24)
    assert rv.tokens == rc.tokens and rv.digest == rc.digest
