"""Bad checkpoints: one line naming the file and the tensor or key, exit 2, no traceback,
and nothing is written."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vkspec.tiny import make_tiny


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("good"), seed=2)


def vkspec(*args):
    return subprocess.run([sys.executable, "-m", "vkspec.cli", *args], capture_output=True,
                          text=True, timeout=120)


def broken(good, tmp_path, edit):
    d = tmp_path / "m"
    shutil.copytree(good, d)
    edit(d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    res = vkspec("run", str(d), "--prompt-ids", "1,2,3", "-n", "2")
    assert res.returncode == 2, res.stderr
    lines = [l for l in res.stderr.strip().splitlines() if l]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    return lines[0]


def edit_tensors(fn):
    def edit(d):
        t = load_file(str(d / "model.safetensors"))
        fn(t)
        save_file(t, str(d / "model.safetensors"))
    return edit


def edit_config(fn):
    def edit(d):
        c = json.loads((d / "config.json").read_text())
        fn(c)
        (d / "config.json").write_text(json.dumps(c))
    return edit


def test_missing_tensor(good, tmp_path):
    line = broken(good, tmp_path, edit_tensors(lambda t: t.pop("model.layers.1.linear_attn.A_log")))
    assert "missing tensor model.layers.1.linear_attn.A_log" in line


def test_wrong_shape(good, tmp_path):
    def f(t):
        t["model.layers.3.self_attn.k_proj.weight"] = np.zeros((5, 64), np.float32)
    line = broken(good, tmp_path, edit_tensors(f))
    assert "model.safetensors" in line and "model.layers.3.self_attn.k_proj.weight" in line
    assert "shape [5, 64]" in line


def test_unknown_model_type(good, tmp_path):
    line = broken(good, tmp_path, edit_config(lambda c: c.update(model_type="mamba9")))
    assert "config.json" in line and "unknown model_type 'mamba9'" in line


def test_truncated_safetensors(good, tmp_path):
    def cut(d):
        p = d / "model.safetensors"
        p.write_bytes(p.read_bytes()[:5000])
    line = broken(good, tmp_path, cut)
    assert "model.safetensors" in line


def test_corrupt_safetensors_header(good, tmp_path):
    def corrupt(d):
        p = d / "model.safetensors"
        b = bytearray(p.read_bytes())
        b[8:20] = b"{not json!!!"
        p.write_bytes(bytes(b))
    line = broken(good, tmp_path, corrupt)
    assert "model.safetensors" in line and "not a readable safetensors file" in line


@pytest.mark.parametrize("key,value,why", [
    ("num_experts_per_tok", 9, "num_experts_per_tok = 9 is out of range"),
    ("partial_rotary_factor", 1.5, "partial_rotary_factor = 1.5 is out of range"),
    ("linear_num_value_heads", 3, "linear_num_value_heads = 3 is out of range"),
    ("num_key_value_heads", 3, "num_key_value_heads = 3 must divide"),
    ("hidden_size", "wide", "hidden_size = 'wide' is not a int"),
])
def test_config_field_out_of_range(good, tmp_path, key, value, why):
    line = broken(good, tmp_path, edit_config(lambda c: c.update({key: value})))
    assert "config.json" in line and why in line


def test_unsupported_spec_fails_closed(good):
    for mode in ("draft-model", "dflash", "dspark"):
        res = vkspec("run", str(good), "--prompt-ids", "1,2", "-n", "2", "--spec", mode)
        assert res.returncode == 2 and "not available" in res.stderr and res.stdout == ""


def test_run_json_contract(good, tmp_path):
    res = vkspec("run", str(good), "--prompt", "def fibonacci(n):", "-n", "12", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    for k in ("tokens", "text", "digest", "forwards", "drafted", "accepted", "decode_tok_s"):
        assert k in out
    assert len(out["tokens"]) == 12 and len(out["digest"]) == 64
    assert "tokens/forward" in res.stderr            # counters go to stderr
    # --prompt-ids works without a tokenizer
    d = tmp_path / "notok"
    shutil.copytree(good, d)
    (d / "tokenizer.json").unlink()
    res2 = vkspec("run", str(d), "--prompt-ids", "1,2,3", "-n", "4", "--json")
    assert res2.returncode == 0 and json.loads(res2.stdout)["text"] == ""


def test_spec_modes_print_the_same_digest(tmp_path):
    d = make_tiny(tmp_path / "echo", seed=1, mtp=True, echo=True)
    outs = {}
    for mode in ("off", "lookup", "mtp", "auto"):
        res = vkspec("run", str(d), "--prompt-ids", "40,41,42,43,44,45,46,47,40,41", "-n", "24",
                     "--spec", mode, "--json")
        assert res.returncode == 0, res.stderr
        outs[mode] = json.loads(res.stdout)
        assert f"[vkspec {mode}] run:" in res.stderr and "tokens/forward" in res.stderr
    assert len({o["digest"] for o in outs.values()}) == 1
    assert outs["mtp"]["forwards"] < outs["off"]["forwards"] and outs["mtp"]["accepted"] > 0
    assert outs["mtp"]["counters"]["acceptance_by_position"]


def test_spec_bad_settings_are_one_line(good, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("spec_mode = 'mtp'\nspec_draft_max = 0\n")
    for args, why in ((["--config", str(bad)], "spec_draft_max = 0 is out of range"),
                      (["--spec", "mtp", "--snapshots", "8"], "spec_mtp_recurrent_snapshots = 8"),
                      (["--spec", "mtp"], "the checkpoint has no MTP head")):
        plain = make_tiny(tmp_path / "plain", seed=1) if "no MTP" in why else good
        res = vkspec("run", str(plain), "--prompt-ids", "1,2", "-n", "2", *args)
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and why in res.stderr, res.stderr


def test_speculative_bench_writes_table_json_and_plot(tmp_path):
    d = make_tiny(tmp_path / "echo", seed=1, mtp=True, echo=True)
    out = tmp_path / "bench"
    res = vkspec("bench", str(d), "-n", "12", "--backends", "cpu", "--modes", "off,lookup,mtp,auto",
                 "--out", str(out), "--rounds", "2")
    assert res.returncode == 0, res.stderr
    assert "| cpu | code-edit | mtp |" in res.stdout and "| cpu | chat | auto |" in res.stdout
    assert "NO" not in res.stdout                      # every run's text equals plain decoding's
    rows = json.loads((out / "bench.json").read_text())
    assert len(rows) == 8 and all(r["identical"] and r["rounds"] == 2 for r in rows)
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "bench.md").read_text().startswith("vkspec bench:")
    assert "vkspec bench" in res.stderr                # the progress bar
    assert len({r["digest"] for r in rows if r["prompt"] == "chat"}) == 1
    alone = vkspec("bench", str(d), "-n", "12", "--backends", "cpu", "--modes", "auto", "--prompts", "chat",
                   "--json")                       # no off row: nothing to compare with, and no crash
    assert alone.returncode == 0, alone.stderr
    (row,) = json.loads(alone.stdout)
    assert row["identical"] is None and row["speedup"] is None
    assert row["digest"] == next(r["digest"] for r in rows if r["prompt"] == "chat")
    bad = vkspec("bench", str(d), "--backends", "cpu", "--rounds", "0", "--out", str(tmp_path / "b2"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--rounds" in bad.stderr, bad.stderr
