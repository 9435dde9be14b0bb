"""Synchronization validation: recorded chains of dependent dispatches, and a full
generation on the dense chain, are hazard-free."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SETTINGS = (HERE.parent / "ci" / "lavapipe" / "vk_layer_settings.txt.in").read_text()


def run_validated(tmp_path, mode):
    log = tmp_path / "vk.log"
    settings = tmp_path / "vk_layer_settings.txt"
    settings.write_text(SETTINGS.replace("@LOG@", str(log)))
    env = dict(os.environ, VK_INSTANCE_LAYERS="VK_LAYER_KHRONOS_validation",
               VK_LAYER_SETTINGS_PATH=str(settings))
    env.pop("VKSPEC_VK_LOG", None)
    res = subprocess.run([sys.executable, str(HERE / "vk_chain_check.py"), mode], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip(), (log.read_text() if log.exists() else "")


def test_validation_layer_reports_a_real_hazard(vk, tmp_path):
    """Positive control: the layer is loaded and sync validation is on."""
    out, log = run_validated(tmp_path, "hazard")
    assert out == "ran"
    assert "SYNC-HAZARD" in log, "synchronization validation did not report a known hazard"


def test_chain_of_24_dependent_dispatches_is_clean(vk, tmp_path):
    out, log = run_validated(tmp_path, "chain")
    assert out == "match"
    assert log == "", f"validation messages:\n{log[:4000]}"


def test_full_generation_on_the_dense_chain_is_clean(vk, tmp_path):
    """Prefill, decode, verify blocks with copy slots, rewinds and the MTP head
    under synchronization validation: no message, and CPU bits throughout."""
    out, log = run_validated(tmp_path, "generate")
    assert out == "match"
    assert log == "", f"validation messages:\n{log[:4000]}"
