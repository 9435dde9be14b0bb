"""The committed trained hybrid (models/tiny-hybrid): it loads, its MTP head
drafts tokens that get accepted, and drafts never change its output."""

from pathlib import Path

import numpy as np
import pytest

from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.sampling import Sampler
from vkspec.speculative import SpecConfig, generate_spec
from vkspec.speculative.sources import build
from vkspec.tokenizer import load_tokenizer

MODEL = Path(__file__).resolve().parent.parent / "models" / "tiny-hybrid"
CODE = "import os\nimport sys\n\n\ndef main(argv):\n    parser = "


@pytest.fixture(scope="module")
def ids():
    return load_tokenizer(MODEL).encode(CODE)


@pytest.mark.parametrize("backend", ["cpu", "vulkan"])
def test_mtp_drafts_are_accepted_and_change_nothing(request, backend, ids):
    if backend == "vulkan":
        request.getfixturevalue("vk")
    m = load_model(MODEL, backend=backend)
    ref = generate(m, ids, 40)
    got = generate_spec(m, ids, 40, Sampler(), *build(m, SpecConfig(spec_mode="mtp", spec_draft_max=2,
                                                                       spec_gate=False)))
    assert got.tokens == ref.tokens and got.digest == ref.digest
    assert got.counters.accepted > 0 and got.forwards < ref.forwards
    assert np.isfinite(got.last_logits).all()


def test_device_equals_cpu(vk, ids):
    a = generate(load_model(MODEL), ids, 24)
    b = generate(load_model(MODEL, backend="vulkan"), ids, 24)
    assert a.tokens == b.tokens and a.digest == b.digest
