"""The expert tier: placement never changes output; the memory plan matches
what the chain allocates; histories; the placement policy."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from vkspec.errors import VkspecError
from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.plan import plan
from vkspec.sampling import Sampler
from vkspec.speculative import SpecConfig, generate_spec
from vkspec.speculative.sources import build
from vkspec.tier.history import History
from vkspec.tier.policy import Placement, split_slots
from vkspec.tier.resident import TierConfig
from vkspec.tiny import make_tiny

PROMPT = [40, 41, 42, 43, 44, 45, 46, 47] * 2 + [3, 9]
N = 40


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("moe"), seed=5, mtp=True, experts=8, top_k=2, echo=True)


@pytest.fixture(scope="module")
def reference(moe_dir):
    return generate(load_model(moe_dir, fmt="int8"), PROMPT, N)


def expert_bytes(model_dir):
    m = load_model(model_dir, fmt="int8")
    e = m.w.layers[0].ffn.experts[0]
    return e.gate.nbytes() + e.up.nbytes() + e.down.nbytes()


@pytest.mark.parametrize("slots,stream,balance", [(0, False, True), (3, False, True), (9, False, False),
                                                  (17, False, True), (9, True, True), (32, False, True)])
def test_placement_never_changes_output(vk, moe_dir, reference, slots, stream, balance):
    gb = slots * expert_bytes(moe_dir) / (1 << 30)
    m = load_model(moe_dir, fmt="int8", backend="vulkan",
                   tier=TierConfig(budget_gb=gb, rate=1, balance=balance, stream=stream))
    assert sum(m.tier.caps) == min(slots, 32)
    got = generate(m, PROMPT, N)
    assert got.tokens == reference.tokens and got.digest == reference.digest
    st = m.tier.stats
    assert st.pairs == (len(PROMPT) + N - 1) * 2 * 4         # every fed row x top-2 x 4 layers
    if slots == 0:
        assert st.hits == 0 and st.cpu == st.pairs
    elif slots == 32:
        assert st.hits == st.pairs and st.cpu == 0
    elif stream:
        assert st.cpu == 0 and st.streamed > 0
    else:
        assert 0 < st.hits < st.pairs and st.cpu > 0


def test_history_start_makes_placement_deterministic_and_output_equal(vk, moe_dir, reference, tmp_path):
    gb = 6 * expert_bytes(moe_dir) / (1 << 30)
    hist = tmp_path / "usage.json"
    m = load_model(moe_dir, fmt="int8", backend="vulkan", tier=TierConfig(budget_gb=gb, history=str(hist)))
    assert generate(m, PROMPT, N).digest == reference.digest
    m.tier.save_history(hist)
    placements = []
    for _ in range(2):
        m = load_model(moe_dir, fmt="int8", backend="vulkan", tier=TierConfig(budget_gb=gb, history=str(hist)))
        placements.append([list(s) for s in m.tier.placement.slots])
        got = generate(m, PROMPT, N)
        assert got.digest == reference.digest
    assert placements[0] == placements[1]
    assert m.tier.history.counts.sum() > 0


@pytest.mark.parametrize("spec,forced", [(dict(spec_mode="mtp", spec_draft_max=3, spec_gate=False), "mixed"),
                                         (dict(spec_mode="lookup", spec_gate=False), None),
                                         (dict(spec_mode="auto"), None)])
def test_drafts_change_the_history_not_the_output(vk, moe_dir, reference, spec, forced):
    gb = 5 * expert_bytes(moe_dir) / (1 << 30)
    m = load_model(moe_dir, fmt="int8", backend="vulkan", tier=TierConfig(budget_gb=gb, rate=1))
    sources, gate = build(m, SpecConfig(**spec), forced=forced, reference=reference.tokens)
    got = generate_spec(m, PROMPT, N, Sampler(), sources, gate)
    assert got.tokens == reference.tokens and got.digest == reference.digest
    assert got.counters.drafted > 0
    assert m.tier.stats.pairs > (got.forwards) * 2 * 4       # verify rows were routed and counted


@pytest.mark.parametrize("budget,snapshots", [(None, 7), (4, 3), (0, 0)])
def test_plan_matches_allocations(vk, moe_dir, budget, snapshots):
    gb = None if budget is None else budget * expert_bytes(moe_dir) / (1 << 30)
    tier = None if gb is None else TierConfig(budget_gb=gb)
    d = plan(moe_dir, fmt="int8", tier=tier, snapshots=snapshots)
    m = load_model(moe_dir, fmt="int8", backend="vulkan", tier=tier)
    st = m.new_state()
    m.forward(PROMPT[:snapshots + 1], st, copies=snapshots)     # allocates the copy slots
    assert d["device_total"] == m.up.allocated
    # tensor by tensor: the plan is the allocation code run without a device
    from vkspec.backends.vulkan.model import VulkanModel
    from vkspec.loader import Loader, open_checkpoint
    from vkspec.weights import set_activations
    cfg, ckpt = open_checkpoint(moe_dir, "int8")
    w = Loader(cfg, ckpt, "int8").load(True)
    set_activations(w, "q8")                                     # load_model's default
    planned = VulkanModel.planned(cfg, w, tier=tier, slots=snapshots)
    assert dict(planned.items) == m.up.made
    # one copy slot: each DeltaNet layer's conv ring and state, (K-1) x conv_dim + nv x dk x dv floats
    c = m.cfg
    cd = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    formula = 3 * ((c.linear_conv_kernel_dim - 1) * cd + c.linear_num_value_heads * c.linear_key_head_dim
                   * c.linear_value_head_dim) * 4
    region = sum((r.ring.n + r.ssm.n) * 4 // m.regions for r in m.states.recurrent)
    assert d["copy_slot_bytes"] == formula == region
    assert d["copy_slots_bytes"] == snapshots * formula


def test_plan_clamps_the_context_as_the_model_does(moe_dir):
    """--ctx past the model's length: the plan reports (and sizes the KV cache
    for) the positions the model allocates, not the number asked for."""
    longest = load_model(moe_dir).cfg.max_position_embeddings
    asked = plan(moe_dir, ctx=4 * longest)
    assert asked["context"] == load_model(moe_dir, ctx=4 * longest).ctx == longest
    assert asked == plan(moe_dir, ctx=longest)
    assert plan(moe_dir)["context"] == load_model(moe_dir).ctx


def test_plan_cli_json(moe_dir):
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", "plan", str(moe_dir), "--budget-gb", "0.001",
                          "--snapshots", "3", "--json"], capture_output=True, text=True, env=os.environ)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d == plan(moe_dir, tier=TierConfig(budget_gb=0.001), snapshots=3)
    for key in ("dense_weights", "routed_experts", "routed_experts_on_device", "kv_cache", "mtp_head",
                "copy_slot_bytes", "copy_slots_bytes", "tier_budget", "host_ram", "device_total"):
        assert key in d
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", "plan", str(moe_dir)], capture_output=True,
                         text=True, env=os.environ)
    assert "recurrent copy slots (7 x" in res.stdout and "device total" in res.stdout


def test_history_file_round_trip_and_bad_files(tmp_path):
    h = History(2, 4)
    h.add(0, [1, 3])
    h.add(1, [2, 2])
    p = tmp_path / "h.json"
    h.save(p)
    g = History.load(p, 2, 4)
    assert g.counts.tolist() == h.counts.tolist()
    with pytest.raises(VkspecError, match="history for 2 layers x 4 experts, the model has 3 x 4"):
        History.load(p, 3, 4)
    p.write_text("{not json")
    with pytest.raises(VkspecError, match="not an expert-usage history"):
        History.load(p, 2, 4)
    p.write_text(json.dumps({"format": "vkspec-expert-usage", "layers": 2, "experts": 4,
                             "counts": [[1, 2]], "rows": [0, 0]}))
    with pytest.raises(VkspecError, match="damaged"):
        History.load(p, 2, 4)


def test_a_bad_history_is_one_line_and_kept(moe_dir, tmp_path):
    bad = tmp_path / "usage.json"
    bad.write_text("garbage")
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", "run", str(moe_dir), "--prompt-ids", "1,2",
                          "-n", "2", "--backend", "vulkan", "--tier-gb", "0.001", "--tier-history", str(bad)],
                         capture_output=True, text=True, env=os.environ)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "not an expert-usage history" in res.stderr
    assert bad.read_text() == "garbage"


def test_split_slots_balance():
    counts = np.zeros((3, 4))
    counts[0] = [9, 8, 7, 6]                 # layer 0 spreads its use, layer 1 and 2 do not
    counts[1] = [9, 0, 0, 0]
    counts[2] = [9, 0, 0, 0]
    assert split_slots(6, counts, 4, balance=False) == [2, 2, 2]
    assert split_slots(6, counts, 4, balance=True) == [4, 1, 1]
    assert split_slots(2, counts, 4, balance=True) == [1, 1, 0]   # the two most used (ties: lower layer)
    assert split_slots(99, counts, 4, balance=True) == [4, 4, 4]
    assert split_slots(0, counts, 4, balance=True) == [0, 0, 0]


def test_placement_admits_by_count_within_the_rate():
    p = Placement([2, 1], 4, rate=1)
    counts = np.array([[5.0, 4, 0, 0], [0, 0, 3, 1]])
    p.initial(counts)
    assert p.resident(0) == {0: 0, 1: 1} and p.resident(1) == {2: 0}
    counts[0, 3] = 9
    counts[1, 1] = 8
    moves = p.step(counts)
    assert len(moves) == 1                   # the rate
    assert moves[0] == (0, 1, 3)             # the bigger gain first: 9 - 4 over 8 - 3
    assert p.step(counts) == [(1, 0, 1)]
    assert p.step(counts) == []              # nothing left to gain


def test_bf16_experts_in_slots(vk, tmp_path):
    """A BF16 checkpoint: the slots hold its experts as bf16 words, as the file
    does, the plan says so, and a partial tier (slots, streaming) gives the
    CPU's bits."""
    d = make_tiny(tmp_path / "bf16", seed=5, mtp=True, experts=8, top_k=2, echo=True, bf16=True)
    ref = generate(load_model(d), PROMPT, N)
    e = load_model(d).w.layers[0].ffn.experts[0]
    assert e.gate.fmt == "bf16"
    per_expert = e.gate.nbytes() + e.up.nbytes() + e.down.nbytes()
    for slots, stream in ((5, False), (5, True)):
        tier = TierConfig(budget_gb=slots * per_expert / (1 << 30), rate=1, stream=stream)
        m = load_model(d, backend="vulkan", tier=tier)
        assert m.tier.expert_bytes == per_expert and sum(m.tier.caps) == slots
        got = generate(m, PROMPT, N)
        assert got.tokens == ref.tokens and got.digest == ref.digest
        assert m.tier.stats.hits > 0
        assert plan(d, tier=tier, snapshots=0)["device_total"] == m.up.allocated
