"""gemv.comp's two lane layouts give the same bits: "parallel" (the 32 lanes
of a row across invocations, a shared-memory tree; the default on GPUs) and
"serial" (one invocation walks a row; the default on Lavapipe, so the other
tests run it there). Every format with edge blocks and 1..8 rows, ragged
shapes, and a model whose chain runs the plain, accumulating (residual),
routed (experts) and row-mapped (draft vocabulary) GEMVs in verify blocks."""

import numpy as np
import pytest

from conftest import bits_equal
from test_formats import FMTS, weights
from vkspec import exact
from vkspec.backends.vulkan.recorder import gemv_layout
from vkspec.errors import VkspecError
from vkspec.formats.matrix import dequantize, f32 as as_f32
from vkspec.formats.quant import quantize
from vkspec.formats.samples import random_weight
from vkspec.loader import load_model
from vkspec.sampling import Sampler
from vkspec.speculative import SpecConfig, generate, generate_spec
from vkspec.speculative.sources import build
from vkspec.tier.resident import TierConfig
from vkspec.tiny import make_tiny

LAYOUTS = ["parallel", "serial"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", FMTS)
def test_every_format_and_row_count(fmt, layout, vk, monkeypatch):
    monkeypatch.setenv("VKSPEC_GEMV_LANES", layout)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    for w in weights(fmt, rng):
        values = dequantize(w)
        for n in range(1, 9):
            bits_equal(vk.gemv(w, x[:n]), exact.gemv(values, x[:n]))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(1, 4), (3, 124), (33, 128), (65, 132), (257, 1000)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_ragged_shapes(shape, layout, vk, monkeypatch):
    """Rows that leave a workgroup part empty, and columns that leave lanes
    without a step (or with one step fewer than others)."""
    monkeypatch.setenv("VKSPEC_GEMV_LANES", layout)
    rng = np.random.default_rng(shape[0] * 7 + shape[1])
    w32 = rng.standard_normal(shape).astype(np.float32)
    x = (rng.standard_normal((8, shape[1])) * 10).astype(np.float32)
    for fmt in ("f32", "int8", "int4-g64"):
        w = as_f32(w32) if fmt == "f32" else quantize(as_f32(w32), fmt)
        for n in (1, 3, 8):
            bits_equal(vk.gemv(w, x[:n]), exact.gemv(dequantize(w), x[:n]))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", ["q4_0", "q5_0", "q8_0"])
def test_blocks_that_start_mid_word(fmt, layout, vk, monkeypatch):
    """Three 18-, 22- or 34-byte blocks a row put every other row's blocks at
    bytes 2 mod 4, where the serial layout's block read (w_block32) shifts
    its words by half a word; 512 columns (the other tests) never do."""
    monkeypatch.setenv("VKSPEC_GEMV_LANES", layout)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((8, 96)).astype(np.float32)
    w = random_weight(fmt, 37, 96, rng)
    assert w.data.reshape(37, -1).shape[1] % 4 == 2
    for n in range(1, 9):
        bits_equal(vk.gemv(w, x[:n]), exact.gemv(dequantize(w), x[:n]))


def test_a_bad_layout_name_is_one_line(vk, monkeypatch):
    monkeypatch.setenv("VKSPEC_GEMV_LANES", "diagonal")
    with pytest.raises(VkspecError, match="VKSPEC_GEMV_LANES='diagonal': use one of parallel, serial"):
        gemv_layout(vk.dev)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("moe"), seed=5, mtp=True, experts=8, top_k=2, echo=True)


@pytest.mark.parametrize("acts", ["q8", "f32"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_chain_with_experts_and_a_draft_vocabulary(vk, moe_dir, layout, acts, monkeypatch):
    """Half the experts in device slots (routed GEMVs), MTP drafts scored over
    a listed vocabulary (row-mapped lm_head), verify blocks of up to 4 rows:
    the tokens and digest of the CPU's plain decoding; gemv_q8.comp's
    variants with q8 activations, gemv.comp's with f32."""
    monkeypatch.setenv("VKSPEC_GEMV_LANES", layout)
    prompt, n = [40, 41, 42, 43, 44, 45, 46, 47] * 2 + [3, 9], 32
    cpu = load_model(moe_dir, fmt="int8", activations=acts)
    want = generate(cpu, prompt, n)
    e = cpu.w.layers[0].ffn.experts[0]
    gb = 16 * (e.gate.nbytes() + e.up.nbytes() + e.down.nbytes()) / (1 << 30)
    m = load_model(moe_dir, fmt="int8", backend="vulkan", tier=TierConfig(budget_gb=gb), activations=acts)
    assert m.recorder.lanes == layout
    sources, gate = build(m, SpecConfig(spec_mode="mtp", spec_draft_max=3, spec_gate=False,
                                        spec_mtp_fr_vocab_size=4))
    got = generate_spec(m, prompt, n, Sampler(), sources, gate)
    assert got.tokens == want.tokens and got.digest == want.digest
    assert got.counters.drafted > 0
    st = m.tier.stats
    assert 0 < st.hits < st.pairs
    suffix = "_serial" if layout == "serial" else ""
    ran = {key[0] for key in m.recorder.algos}
    stem = "gemv_q8" if acts == "q8" else "gemv"
    assert {f"{stem}.int8{kind}{suffix}.spv" for kind in ("", "_routed", "_rowmap")} <= ran, sorted(ran)
