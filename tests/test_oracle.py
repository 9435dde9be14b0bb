"""vkspec's exact CPU path against transformers' own Qwen3-Next (float32 in torch).

Logits may differ by rounding (torch sums in its own order), so they are
compared within LOGIT_TOL at logit scale ~1; greedy ids must be identical.
"""

import numpy as np
import pytest

from conftest import require  # noqa: E402

torch = require("torch")
require("transformers")
pytestmark = pytest.mark.oracle

from oracle_models import SHAPES, build  # noqa: E402

from vkspec.speculative import generate  # noqa: E402
from vkspec.loader import load_model  # noqa: E402

LOGIT_TOL = 1e-4
PROMPT = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 46, 26]


@pytest.fixture(scope="module", params=sorted(SHAPES))
def pair(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    ref = build(request.param, d)
    return ref, load_model(d), request.param


def test_prefill_logits(pair):
    ref, model, _ = pair
    with torch.no_grad():
        want = ref(torch.tensor([PROMPT]), use_cache=False).logits[0].numpy()
    _, got = model.forward(PROMPT, model.new_state())
    assert np.abs(got - want).max() < LOGIT_TOL


def test_decode_steps_and_block_on_cache(pair):
    ref, model, _ = pair
    st = model.new_state()
    model.forward(PROMPT[:8], st)
    with torch.no_grad():
        out = ref(torch.tensor([PROMPT[:8]]), use_cache=True)
        cache = out.past_key_values
        for t in PROMPT[8:10]:          # decode steps, one row each
            out = ref(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            _, got = model.forward([t], st)
            assert np.abs(got[0] - out.logits[0, -1].numpy()).max() < LOGIT_TOL
        block = PROMPT[10:16]           # a 6-row block on a non-empty cache
        out = ref(torch.tensor([block]), past_key_values=cache, use_cache=True)
    _, got = model.forward(block, st)
    assert np.abs(got - out.logits[0].numpy()).max() < LOGIT_TOL


def test_greedy_ids_64(pair):
    ref, model, name = pair
    with torch.no_grad():
        want = ref.generate(torch.tensor([PROMPT[:5]]), max_new_tokens=64, do_sample=False,
                            min_new_tokens=64, pad_token_id=0)[0, 5:].tolist()
    got = generate(model, PROMPT[:5], 64).tokens
    assert got == want, name
