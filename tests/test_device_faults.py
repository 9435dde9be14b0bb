"""Device faults lose nothing: a device that fails at any stage of a
speculative round (before the verify, in it, after it, in a rewind, in a
replay, in an expert upload) leaves the last commit; the run then stops with
a prefix of the unfaulted run's tokens, or, with a fallback, continues on the
CPU and ends with the unfaulted run's tokens and digest. Faults are injected
with backends/vulkan/faults.py, transient (one failed call) or lost (every
later device call fails, so the state must be rebuilt on the CPU)."""

import json
import os
import subprocess
import sys

import pytest

from vkspec.backends.vulkan.faults import Faults
from vkspec.errors import DeviceError, VkspecError
from vkspec.loader import load_model
from vkspec.sampling import Sampler
from vkspec.speculative import SpecConfig, generate, generate_spec
from vkspec.speculative.fallback import Fallback
from vkspec.speculative.sources import build
from vkspec.tier.resident import TierConfig
from vkspec.tiny import make_tiny

PROMPT = [5, 9, 14, 200, 33, 7, 61, 5, 9, 14, 200, 33]
N = 24
SAMPLING = dict(temperature=0.8, seed=3)
SPEC = dict(spec_mode="mtp", spec_draft_max=3, spec_mtp_recurrent_snapshots=1, spec_gate=False)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"), seed=4, mtp=True)


@pytest.fixture(scope="module")
def cpu(tiny_dir):
    return load_model(tiny_dir)


@pytest.fixture(scope="module")
def dev(vk, tiny_dir):
    return load_model(tiny_dir, backend="vulkan")


@pytest.fixture(scope="module")
def reference(cpu):
    return generate(cpu, PROMPT, N, Sampler(**SAMPLING))


def spec_run(model, reference, faults=None, fallback=None, sampler=None):
    """A sampled MTP run whose drafts follow the `cycle` pattern (verifies that
    keep 1, 2, 3 rows; with one copy slot the second is a replay)."""
    sources, gate = build(model, SpecConfig(**SPEC).check(), forced="cycle", reference=reference.tokens)
    model.faults = faults
    try:
        return generate_spec(model, PROMPT, N, sampler or Sampler(**SAMPLING), sources, gate,
                             snapshots=SPEC["spec_mtp_recurrent_snapshots"], fallback=fallback)
    finally:
        model.faults = None


@pytest.fixture(scope="module")
def stages(dev, reference):
    """stage name -> (faults stage, at): a middle occurrence, found in an unfaulted run's log."""
    log = Faults()
    got = spec_run(dev, reference, log)
    assert got.tokens == reference.tokens and got.digest == reference.digest
    first_round = len(log.occurrences("forward")) - len(log.occurrences("rewind"))     # prefill blocks

    def middle(xs):
        assert xs, "the unfaulted run never reached this stage"
        return xs[len(xs) // 2]
    verifies = [a for a in log.occurrences("forward", lambda r: r > 1) if a > first_round]
    replays, n_fwd, after_rewind0 = [], 0, False
    for stage, rows in log.log:
        if stage == "forward":
            n_fwd += 1
            if after_rewind0:
                replays.append(n_fwd)
        after_rewind0 = stage == "rewind" and rows == 0
    return {
        "prefill": ("forward", 1),
        "head prefill (the MTP head reads the prompt)": ("mtp", 1),
        "draft (before the verify)": ("mtp", middle(log.occurrences("mtp")[2:])),
        "verify": ("forward", middle(verifies)),
        "after the verify (readback)": ("readback", middle([a for a in log.occurrences("readback", lambda r: r > 1)
                                                           if a > first_round])),
        "rewind": ("rewind", middle(log.occurrences("rewind"))),
        "replay": ("forward", middle(replays)),
    }


STAGES = ["prefill", "head prefill (the MTP head reads the prompt)", "draft (before the verify)", "verify", "after the verify (readback)", "rewind", "replay"]


@pytest.mark.parametrize("lost", [False, True], ids=["transient", "lost"])
@pytest.mark.parametrize("stage", STAGES)
def test_fallback_cpu_gives_the_unfaulted_run(dev, cpu, reference, stages, stage, lost):
    fb = Fallback(lambda: cpu, quiet=True)
    got = spec_run(dev, reference, Faults(*stages[stage], lost=lost), fb)
    assert got.tokens == reference.tokens and got.digest == reference.digest
    # a device that still answers hands its state over; a lost one's is rebuilt
    assert fb.moves == ["replay" if lost else "snapshot"]


@pytest.mark.parametrize("lost", [False, True], ids=["transient", "lost"])
@pytest.mark.parametrize("stage", STAGES)
def test_without_fallback_a_clean_stop_at_the_last_commit(dev, reference, stages, stage, lost):
    sampler = Sampler(**SAMPLING)
    with pytest.raises(DeviceError, match="the Vulkan device failed") as e:
        spec_run(dev, reference, Faults(*stages[stage], lost=lost), sampler=sampler)
    assert "\n" not in str(e.value)
    if stage.startswith(("prefill", "head prefill")):
        assert not hasattr(e.value, "tokens")          # nothing was generated
        return
    got = e.value.tokens
    assert 0 < len(got) < N and got == reference.tokens[:len(got)]
    assert sampler.draws == len(got)                     # no draw of the failed round survives
    assert not e.value.state_lost
    if not lost:                                         # the device goes on, as good as new
        again = spec_run(dev, reference)
        assert again.tokens == reference.tokens and again.digest == reference.digest


class FailingRewinds(Faults):
    """Every rewind from the at-th on fails: the decoder's own restore too."""

    def hit(self, stage, rows=0):
        super().hit(stage, rows)
        if stage == "rewind" and self.seen["rewind"] >= min(self.at):
            raise RuntimeError("vk::Queue::submit: ErrorDeviceLost (injected rewind)")


def test_restore_holds_when_the_model_cannot_rewind(dev, cpu, reference, stages):
    """The output, sampler and sources come back even when the model's own
    rewind fails; the model's state is then unknown, so a fallback rebuilds it."""
    at = stages["rewind"][1]
    sampler = Sampler(**SAMPLING)
    with pytest.raises(DeviceError) as e:
        spec_run(dev, reference, FailingRewinds("rewind", at), sampler=sampler)
    got = e.value.tokens
    assert got == reference.tokens[:len(got)] and sampler.draws == len(got) and e.value.state_lost
    fb = Fallback(lambda: cpu, quiet=True)
    got = spec_run(dev, reference, FailingRewinds("rewind", at), fb)
    assert got.tokens == reference.tokens and got.digest == reference.digest and fb.moves == ["replay"]


def test_on_token_sees_each_token_once_across_a_fallback(dev, cpu, reference, stages):
    """A token emitted in the round that failed is emitted again on the CPU;
    the caller (the server's stream) sees it once."""
    seen = []
    sources, gate = build(dev, SpecConfig(**SPEC).check(), forced="cycle", reference=reference.tokens)
    dev.faults = Faults(*stages["rewind"])
    try:
        got = generate_spec(dev, PROMPT, N, Sampler(**SAMPLING), sources, gate, snapshots=1,
                            fallback=Fallback(lambda: cpu, quiet=True),
                            on_token=lambda tok, row: seen.append(tok) and False)
    finally:
        dev.faults = None
    assert seen == got.tokens == reference.tokens


# --- the expert tier ---------------------------------------------------------------------

MOE_PROMPT = [40, 41, 42, 43, 44, 45, 46, 47] * 2 + [3, 9]
MOE_N = 40


@pytest.fixture(scope="module")
def moe(vk, tmp_path_factory):
    """(a fresh tiered model each call, the CPU model, the reference, the
    uploads of an unfaulted run): a tier's placement carries over from run to
    run, so each test starts from a model as loaded."""
    d = make_tiny(tmp_path_factory.mktemp("moe"), seed=5, mtp=True, experts=8, top_k=2, echo=True)
    cpu = load_model(d, fmt="int8", mtp=False)
    one = cpu.w.layers[0].ffn.experts[0]
    gb = 3 * (one.gate.nbytes() + one.up.nbytes() + one.down.nbytes()) / (1 << 30)

    def fresh():
        return load_model(d, fmt="int8", backend="vulkan", mtp=False, tier=TierConfig(budget_gb=gb, rate=1))
    ref = generate(cpu, MOE_PROMPT, MOE_N, Sampler(**SAMPLING))
    dev, log = fresh(), Faults()
    dev.faults = log
    got = generate(dev, MOE_PROMPT, MOE_N, Sampler(**SAMPLING))
    assert got.tokens == ref.tokens and got.digest == ref.digest
    uploads = log.occurrences("upload")
    assert len(uploads) > 4, "the tier moved too few experts to test"
    return fresh, cpu, ref, uploads


def tier_holds_what_it_says(dev):
    """Every expert the placement calls resident is in its slot, byte for
    byte, and the maps the shaders read name exactly those."""
    import numpy as np
    from vkspec.tier.resident import NO_SLOT, PARTS
    t = dev.tier
    for o, ffn in t.layers.items():
        res = t.placement.resident(o)
        want = np.full(t.E, NO_SLOT, np.uint32)
        for e, slot in res.items():
            want[e] = slot
        assert np.array_equal(ffn.smap.data()[:t.E], want), f"layer {o}: the map is not the placement"
        for e, slot in res.items():
            for part in PARTS:
                qs, per = t._pieces(t.layer_ids[o], part)
                mine = qs[e * per:(e + 1) * per]
                data = np.concatenate([q.data[q.stored(slice(0, q.rows))].reshape(-1) for q in mine])
                p = getattr(ffn, part).single
                rows = sum(q.rows for q in mine)
                got = dev.dev.read(p.data, slot * rows * p.row_bytes // 4, data.size // 4, np.uint32)
                assert got.tobytes() == data.tobytes(), f"layer {o} slot {slot} does not hold expert {e}"


@pytest.mark.parametrize("lost", [False, True], ids=["transient", "lost"])
@pytest.mark.parametrize("fallback", ["cpu", None])
def test_a_failed_expert_upload(moe, lost, fallback):
    fresh, cpu, ref, uploads = moe
    dev = fresh()
    fb = Fallback(lambda: cpu, quiet=True) if fallback else None
    dev.faults = Faults("upload", uploads[len(uploads) // 2], lost)
    try:
        if fb:
            got = generate_spec(dev, MOE_PROMPT, MOE_N, Sampler(**SAMPLING), fallback=fb)
            assert got.tokens == ref.tokens and got.digest == ref.digest
            assert fb.moves == ["replay" if lost else "snapshot"]
        else:
            with pytest.raises(DeviceError, match="the Vulkan device failed in a forward") as e:
                generate_spec(dev, MOE_PROMPT, MOE_N, Sampler(**SAMPLING))
            assert e.value.tokens == ref.tokens[:len(e.value.tokens)]
    finally:
        dev.faults = None
    assert dev.tier.broken is None
    tier_holds_what_it_says(dev)
    # the slots the failed upload was filling are never read: the device goes on exactly
    again = generate(dev, MOE_PROMPT, MOE_N, Sampler(**SAMPLING))
    assert again.tokens == ref.tokens and again.digest == ref.digest


# --- loading ------------------------------------------------------------------------------


def test_an_allocation_failure_at_load_names_the_tensor_and_the_plan(vk, tiny_dir, monkeypatch):
    monkeypatch.setenv("VKSPEC_FAULT", "alloc@5")
    with pytest.raises(DeviceError) as e:
        load_model(tiny_dir, backend="vulkan")
    msg = str(e.value)
    assert "\n" not in msg
    assert "could not allocate weights:" in msg and "of the plan's" in msg and "ErrorOutOfDeviceMemory" in msg, msg


def test_device_errors_are_one_line_vkspec_errors(vk):
    from vkspec.backends.vulkan.device import device_calls
    assert issubclass(DeviceError, VkspecError)
    with pytest.raises(DeviceError, match=r"^the Vulkan device failed in a test: vk::Queue::submit: ErrorDeviceLost$"):
        with device_calls("in a test"):
            raise RuntimeError("vk::Queue::submit: ErrorDeviceLost\nmore detail")
    with pytest.raises(TypeError):                         # a bug stays a bug
        with device_calls("in a test"):
            raise TypeError("not a device failure")


# --- the command line ---------------------------------------------------------------------

ARGS = ["--prompt-ids", ",".join(map(str, PROMPT)), "-n", str(N), "--spec", "mtp", "--temperature", "0.8",
        "--seed", "3", "--json"]


def cli(model_dir, *args, fault=None, tmp_path=None):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env.pop("VKSPEC_FAULT", None)
    if fault:
        env["VKSPEC_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "vkspec.cli", "run", str(model_dir), *args],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def cli_reference(tiny_dir, tmp_path_factory):
    r = cli(tiny_dir, *ARGS, "--backend", "cpu", tmp_path=tmp_path_factory.mktemp("cli"))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_cli_stops_with_the_tokens_so_far(vk, tiny_dir, cli_reference, tmp_path):
    r = cli(tiny_dir, *ARGS, "--backend", "vulkan", fault="forward@5", tmp_path=tmp_path)
    assert r.returncode == 2
    out = json.loads(r.stdout)
    assert out["stopped"] and "the Vulkan device failed in a forward" in out["error"]
    assert 0 < len(out["tokens"]) < N and out["tokens"] == cli_reference["tokens"][:len(out["tokens"])]
    errors = [l for l in r.stderr.splitlines() if l.startswith("vkspec:")]
    assert len(errors) == 1 and "stopped after" in errors[0] and "Traceback" not in r.stderr


@pytest.mark.parametrize("fault", ["forward@5", "forward@5!", "alloc@5"])
def test_cli_fallback_cpu_gives_the_unfaulted_run(vk, tiny_dir, cli_reference, tmp_path, fault):
    r = cli(tiny_dir, *ARGS, "--backend", "vulkan", "--fallback", "cpu", fault=fault, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tokens"] == cli_reference["tokens"] and out["digest"] == cli_reference["digest"]
    assert out["fallback"] == {"forward@5": "snapshot", "forward@5!": "replay", "alloc@5": "load"}[fault]
    assert "continuing on the CPU" in r.stderr or "running on the CPU" in r.stderr


def test_cli_allocation_failure_at_load_is_one_line(vk, tiny_dir, tmp_path):
    r = cli(tiny_dir, *ARGS, "--backend", "vulkan", fault="alloc@3", tmp_path=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("vkspec: the Vulkan device could not allocate")
