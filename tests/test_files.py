"""What vkspec writes between runs lives in the user's cache, never beside
the model: the expert-usage history, and `make demo` leaves the checkout
clean. A place that cannot be written costs a warning line, not output."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vkspec.cachedir import model_cache_dir
from vkspec.tier.history import FILE_NAME, History, default_paths
from vkspec.tiny import make_tiny

ROOT = Path(__file__).resolve().parent.parent


def test_history_save_to_an_unwritable_place_warns_once(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    h = History(2, 4)
    h.add(0, [1, 2])
    assert h.save(blocker / "sub" / FILE_NAME) is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expert-usage history was not saved" in err
    assert blocker.read_text() == ""


def test_history_default_paths_start_from_the_shipped_file_then_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    model = make_tiny(tmp_path / "m", seed=1)
    cached = model_cache_dir(model) / FILE_NAME
    assert default_paths(model) == (None, str(cached))
    History(2, 4).save(model / FILE_NAME)
    assert default_paths(model) == (str(model / FILE_NAME), str(cached))
    History(2, 4).save(cached)
    assert default_paths(model) == (str(cached), str(cached))


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("moe"), seed=5, mtp=True, experts=8, top_k=2, echo=True)


def run_tier(model, xdg):
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg)}
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", "run", str(model), "--prompt-ids", "1,2,3",
                          "-n", "4", "--backend", "vulkan", "--tier-gb", "0.001", "--tier-history", "--json"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout), res.stderr


def test_tier_history_goes_to_the_cache_and_an_unwritable_one_warns(vk, moe_dir, tmp_path, monkeypatch):
    from vkspec.config import load_config
    cfg = load_config(moe_dir)
    layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    shipped = moe_dir / FILE_NAME
    start = History(layers, cfg.num_experts)
    start.counts[:] = 5.0
    start.save(shipped)
    data = shipped.read_bytes()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out, _ = run_tier(moe_dir, tmp_path / "xdg")
    h = History.load(model_cache_dir(moe_dir) / FILE_NAME, layers, cfg.num_experts)
    assert (h.counts >= 5.0).all() and h.rows.sum() > 0         # began from the shipped counts
    assert shipped.read_bytes() == data                          # which stay as shipped
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    again, err = run_tier(moe_dir, blocker / "xdg")
    assert again["tokens"] == out["tokens"]
    warnings = [line for line in err.splitlines() if "expert-usage history was not saved" in line]
    assert len(warnings) == 1       # once (the default's MTP drafts warn once more, for their counts file)


def demo_commands():
    """The `vkspec ...` lines of the Makefile's demo recipe, with the prompt."""
    text = (ROOT / "Makefile").read_text()
    prompt = re.search(r"^DEMO_PROMPT := \$\$(.*)$", text, re.M).group(1)
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.M).group(1)
    cmds = []
    for line in recipe.splitlines():
        line = line.strip().replace("$(VENV)/bin/vkspec", "vkspec").replace("$(DEMO_PROMPT)", "PROMPT")
        if line.startswith("vkspec "):
            args = [a if a != "PROMPT" else None for a in shlex.split(line)[1:]]
            cmds.append(args)
    return cmds, bytes(prompt[1:-1], "utf-8").decode("unicode_escape")


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_demo_runs_leave_the_checkout_clean(tmp_path):
    """Each speculative CPU run of `make demo` (the Vulkan ones take the same
    file paths), against the bundled model: git status is what it was."""
    def status():
        return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "models"],
                              cwd=ROOT, capture_output=True, text=True, check=True).stdout
    before = status()
    cmds, prompt = demo_commands()
    runs = [c for c in cmds if c[0] == "run" and "cpu" in c]
    assert runs, cmds
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    for c in runs:
        args = [prompt if a is None else a for a in c]
        res = subprocess.run([sys.executable, "-m", "vkspec.cli", *args], cwd=ROOT, capture_output=True,
                             text=True, env=env, timeout=600)
        assert res.returncode == 0, res.stderr
    assert status() == before
    assert list((tmp_path / "xdg" / "vkspec" / "models").glob("*/vocab_usage.bin"))
