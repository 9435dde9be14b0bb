"""The MTP head's draft vocabulary: the list's rules and its counts file (in
the user's cache, keyed by the model's content hash; the model folder is
only read)."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.sampling import Sampler
from vkspec.speculative import SpecConfig, generate_spec
from vkspec.speculative.sources import build
from vkspec.cachedir import model_cache_dir
from vkspec.speculative.vocab import FILE_NAME, HALVE_EVERY, DraftVocab, read_counts, write_counts
from vkspec.tiny import make_tiny


def test_list_top_n_three_quarters_and_conversation():
    v = DraftVocab(100, size=3)
    v.counts[:] = 0
    v.counts[[10, 11, 12, 13, 14]] = [9, 8, 4, 3, 2]     # the 3rd is 4: 3 >= 0.75 * 4 joins, 2 does not
    v.begin([50])                                        # a prompt token counts and joins
    assert set(v.ids.tolist()) == {10, 11, 12, 13, 50}
    v.picked(77)                                         # a picked token missing joins at once
    assert 77 in v.ids and v.appended == 1
    assert DraftVocab(100, size=0).whole and DraftVocab(100, size=100).whole


def test_counts_halve_every_1024_tokens_and_the_list_is_rebuilt():
    v = DraftVocab(50, size=2)
    v.begin([1] * 1000)
    assert v.counts[1] == 1000 and v.rebuilds == 1
    for _ in range(HALVE_EVERY - 1000):
        v.picked(2)
    assert v.counts[1] == 500 and v.counts[2] == 12 and v.since == 0 and v.rebuilds == 2


def test_best_prefers_listed_ids_and_reports_its_probability():
    v = DraftVocab(6, size=2)
    v.counts[:] = [0, 5, 0, 4, 0, 0]
    v.rebuild()
    tok, p = v.best(np.array([9.0, 1.0, 0.0, 1.0, 0.0, 0.0], np.float32))
    assert tok == 1 and p == pytest.approx(0.5)          # 0 is not listed; ties go to the lower id


def test_file_round_trip(tmp_path):
    path = tmp_path / FILE_NAME
    counts = np.arange(7, dtype=np.float32)
    write_counts(path, counts, 5)
    got, since = read_counts(path, 7)
    assert got.tobytes() == counts.tobytes() and since == 5


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"), seed=2, mtp=True, echo=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of this test's own (XDG_CACHE_HOME, seen by subprocesses too)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


def counts_path(model_dir):
    return model_cache_dir(model_dir) / FILE_NAME


def run_mtp(model_dir, *extra):
    env = dict(os.environ)
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", "run", str(model_dir), "--prompt-ids",
                          "1,2,3,4", "-n", "12", "--spec", "mtp", "--json", *extra],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    return json.loads(res.stdout), res.stderr


def folder_state(d):
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in d.iterdir())


def test_a_run_saves_counts_in_the_cache_and_the_next_starts_from_them(tiny_dir, cache):
    before = folder_state(tiny_dir)
    path = counts_path(tiny_dir)
    assert str(path).startswith(str(cache / "vkspec" / "models"))
    run_mtp(tiny_dir)
    c1, _ = read_counts(path, 512)
    assert c1.sum() == 4 + 12                            # prompt tokens and picks
    run_mtp(tiny_dir)
    c2, _ = read_counts(path, 512)
    assert c2.sum() == 2 * (4 + 12)
    assert folder_state(tiny_dir) == before               # the model folder is never written


def test_shipped_counts_start_the_first_run_and_are_never_written(tiny_dir, cache):
    shipped = tiny_dir / FILE_NAME
    write_counts(shipped, np.full(512, 2.0, np.float32), 0)
    data = shipped.read_bytes()
    try:
        run_mtp(tiny_dir)
        c1, _ = read_counts(counts_path(tiny_dir), 512)
        assert c1.sum() == 2 * 512 + 4 + 12               # began from the shipped counts
        run_mtp(tiny_dir)
        c2, _ = read_counts(counts_path(tiny_dir), 512)
        assert c2.sum() == c1.sum() + 4 + 12              # then from the cache copy
        assert shipped.read_bytes() == data
    finally:
        shipped.unlink()


def test_an_unwritable_cache_costs_one_warning_line_not_the_output(tiny_dir, tmp_path, monkeypatch):
    """Root writes through chmod, so the place that cannot be written is a
    path under a plain file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    ref, _ = run_mtp(tiny_dir)
    out, err = run_mtp(tiny_dir)
    assert out["tokens"] == ref["tokens"] and len(out["tokens"]) == 12
    warnings = [line for line in err.splitlines() if "were not saved" in line]
    assert len(warnings) == 1 and "draft-vocabulary counts" in warnings[0]


def test_the_cache_key_follows_the_content_not_the_place(tiny_dir, tmp_path):
    import shutil
    copy = tmp_path / "elsewhere"
    shutil.copytree(tiny_dir, copy)
    assert model_cache_dir(copy) == model_cache_dir(tiny_dir)
    w = copy / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1                                        # a weight's last byte
    w.write_bytes(bytes(data))
    assert model_cache_dir(copy) != model_cache_dir(tiny_dir)
    shutil.copy(tiny_dir / "model.safetensors", w)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["rms_norm_eps"] = cfg.get("rms_norm_eps", 1e-6) * 2
    (copy / "config.json").write_text(json.dumps(cfg))
    assert model_cache_dir(copy) != model_cache_dir(tiny_dir)


def _good(vocab=512):
    body = b"VKSPECVU" + struct.pack("<III", 1, vocab, 0) + np.ones(vocab, "<f4").tobytes()
    import zlib
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize("damage,reason", [
    (lambda b: b"not a counts file at all", "not a vkspec vocabulary-usage file"),
    (lambda b: _good(100), "counts for a vocabulary of 100"),
    (lambda b: b[:-9], "ends on a damaged record"),
    (lambda b: b[:-6] + bytes([b[-6] ^ 1]) + b[-5:], "checksum mismatch"),
])
def test_a_bad_counts_file_is_never_overwritten(tiny_dir, cache, damage, reason):
    path = counts_path(tiny_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    bad = damage(_good())
    path.write_bytes(bad)
    out, err = run_mtp(tiny_dir)
    assert path.read_bytes() == bad                      # kept as it was
    assert reason in err and err.count(reason) == 1
    assert out["tokens"]


def test_bad_shipped_counts_are_read_past_and_kept(tiny_dir, cache):
    shipped = tiny_dir / FILE_NAME
    shipped.write_bytes(b"garbage")
    try:
        out, err = run_mtp(tiny_dir)
        assert err.count("not a vkspec vocabulary-usage file") == 1 and out["tokens"]
        assert shipped.read_bytes() == b"garbage"
        c, _ = read_counts(counts_path(tiny_dir), 512)  # the cache starts from zero counts
        assert c.sum() == 4 + 12
    finally:
        shipped.unlink()


def test_the_list_never_changes_output(tiny_dir):
    model = load_model(tiny_dir)
    prompt = [3, 17, 250, 99, 1, 2]
    ref = generate(model, prompt, 32)
    for size in (1, 5, 0):
        sources, gate = build(model, SpecConfig(spec_mode="mtp", spec_gate=False, spec_draft_max=3,
                                                spec_mtp_fr_vocab_size=size))
        got = generate_spec(model, prompt, 32, Sampler(), sources, gate)
        assert got.tokens == ref.tokens and got.digest == ref.digest


def test_the_device_scores_the_same_list(vk, tiny_dir):
    """A short list on the dense chain: the head's lm_head reads only the
    listed rows there too, so every draft, acceptance and token is the CPU's."""
    prompt = [3, 17, 250, 99, 1, 2, 17, 250]
    runs = {}
    for backend in ("cpu", "vulkan"):
        model = load_model(tiny_dir, backend=backend)
        sources, gate = build(model, SpecConfig(spec_mode="mtp", spec_gate=False, spec_draft_max=3,
                                                spec_mtp_fr_vocab_size=5))
        runs[backend] = generate_spec(model, prompt, 32, Sampler(), sources, gate)
        assert sources[0].vocab.listed is not None and sources[0].vocab.listed.size < model.cfg.vocab_size
        ref = generate(model, prompt, 32)
        assert runs[backend].tokens == ref.tokens and runs[backend].digest == ref.digest
    c, v = runs["cpu"], runs["vulkan"]
    assert (v.forwards, v.drafted, v.accepted) == (c.forwards, c.drafted, c.accepted)


def test_a_list_of_every_id_is_the_whole_vocabulary():
    """Counts that cannot rank the ids (all zero) list every id: the head
    then scores the whole lm_head, not a copy of it through a list."""
    v = DraftVocab(64, size=5)
    v.begin([1, 2])
    assert v.ids.size == 64 and v.listed is None
    v.counts[:10] = np.arange(10, 0, -1)
    v.rebuild()
    assert v.listed is not None and v.listed.size < 64
