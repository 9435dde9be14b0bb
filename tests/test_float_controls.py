"""The driver held to the contract: the float controls a device offers are
read (vkinfo.py) and declared in every shader (shaders/float_controls.py);
the start-up probe checks vkspec/ieee.py's cases on the device and refuses a
device that fails one, naming it (--fallback cpu then runs on the CPU)."""

import os
import re
import subprocess

import numpy as np
import pytest

from conftest import require_tool
from vkspec import ieee
from vkspec.backends.cpu import fpenv
from vkspec.shaders import build, float_controls


def test_the_exact_answers_are_numpys():
    """The cases' answers (integers and fractions) are what NumPy computes in
    an IEEE process; the reported-only ones are min/max with a NaN."""
    fails, notes = ieee.check(fpenv.numpy_results())
    assert fails == [] and len(notes) == 3


def test_round_f32_is_ieee_on_random_operands():
    """expected() against NumPy on random float32 bit patterns, denormals and
    near-overflow included: the exact model the probes trust is itself right."""
    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0, 2**32, 3000, dtype=np.uint64),
                           rng.integers(0, 0x00800000, 500, dtype=np.uint64),            # denormals
                           rng.integers(0x7E800000, 0x7F800000, 500, dtype=np.uint64)]).astype(np.uint32)
    a, b = bits, np.roll(bits, 1)
    fa, fb = a.view(np.float32), b.view(np.float32)
    with np.errstate(all="ignore"):
        for op, got in (("add", fa + fb), ("sub", fa - fb), ("mul", fa * fb)):
            for x, y, g in zip(a.tolist(), b.tolist(), got.view(np.uint32).tolist()):
                want = ieee.expected(op, x, y)
                assert (ieee.is_nan(g) if want == ieee.NAN else g == want), (op, hex(x), hex(y), hex(g), want)


def test_declared_modes_are_valid_spirv_in_every_shader(tmp_path):
    spirv_val = require_tool("spirv-val", "Debian spirv-tools")
    build.compile_all()
    shaders = sorted(build.HERE.glob("*.spv"))
    assert len(shaders) > 20
    for spv in shaders:
        code = spv.read_bytes()
        assert float_controls.add_modes(code, []) == code
        assert float_controls.declared(code) == set()
        patched = float_controls.add_modes(code, list(float_controls.MODES))
        assert float_controls.declared(patched) == set(float_controls.MODES)
        assert float_controls.add_modes(patched, list(float_controls.MODES)).count(b"SPV_KHR_float_controls") == 1
        tmp = tmp_path / spv.name
        tmp.write_bytes(patched)
        r = subprocess.run([spirv_val, "--target-env", "vulkan1.1", str(tmp)], capture_output=True, text=True)
        assert r.returncode == 0, f"{spv.name}: {r.stdout}{r.stderr}"


def test_vkinfo_reads_what_vulkaninfo_prints(vk):
    from vkspec.backends.vulkan import vkinfo
    exe = require_tool("vulkaninfo", "Debian vulkan-tools")
    text = subprocess.run([exe], capture_output=True, text=True, env=os.environ).stdout
    dev = vkinfo.device(int(os.environ.get("VKSPEC_DEVICE", "0")))
    fc = dev.float_controls

    def flag(name):
        return re.search(rf"{name}\s*=\s*(true|false)", text).group(1) == "true"
    assert fc.signed_zero_inf_nan_preserve == flag("shaderSignedZeroInfNanPreserveFloat32")
    assert fc.denorm_preserve == flag("shaderDenormPreserveFloat32")
    assert fc.rounding_rte == flag("shaderRoundingModeRTEFloat32")
    assert re.search(rf"driverName\s*=\s*{re.escape(dev.driver_name)}", text)
    assert dev.name in text


def test_the_device_declares_what_it_offers_and_passes_the_probe(vk):
    from vkspec.backends.vulkan.device import get_device, load_shader
    dev = get_device()
    fc = dev.info.float_controls
    offered = {"SignedZeroInfNanPreserve": fc.signed_zero_inf_nan_preserve, "DenormPreserve": fc.denorm_preserve,
               "RoundingModeRTE": fc.rounding_rte}
    assert dev.float_modes == [m for m in float_controls.MODES if offered[m]]
    assert float_controls.declared(dev.spirv(load_shader("gemv", "q4_k"))) == set(dev.float_modes)
    assert dev.probe.ok and dev.probe.cases == len(ieee.CASES), dev.probe.failures


@pytest.fixture
def flushing_device(vk, monkeypatch):
    """A device that flushes denormal products to zero, as far as the probe can
    tell: no cached device, and the case's operand zeroed on its way there."""
    from vkspec.backends.vulkan import device, probe
    real = probe.case_words
    at = [c.name for c in ieee.CASES].index("mul gives a denormal product: 1e-20 * 1e-20")

    def words(cases=ieee.CASES):
        w = real(cases)
        w[at, 1] = 0
        return w
    monkeypatch.setattr(probe, "case_words", words)
    monkeypatch.setattr(device, "_DEVICE", None)
    return ieee.CASES[at].name


def test_a_device_that_fails_the_probe_is_refused_naming_the_case(flushing_device):
    from vkspec.backends.vulkan.device import Device
    from vkspec.errors import DeviceError
    with pytest.raises(DeviceError) as e:
        Device()
    msg = str(e.value)
    assert flushing_device in msg and "got +0" in msg and "--fallback cpu" in msg and "\n" not in msg
    assert not Device(check=False).probe.ok                # vkspec doctor reports it instead


def test_the_command_line_refuses_it_or_falls_back(flushing_device, tmp_path, capsys):
    from vkspec import cli
    from vkspec.tiny import make_tiny
    d = make_tiny(tmp_path / "tiny", seed=4, mtp=True)
    args = ["run", str(d), "--prompt-ids", "5,9,14,200", "-n", "6", "--json"]
    assert cli.main(args + ["--backend", "vulkan"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flushing_device in err
    assert cli.main(args + ["--backend", "cpu"]) == 0
    want = capsys.readouterr().out
    assert cli.main(args + ["--backend", "vulkan", "--fallback", "cpu"]) == 0
    got = capsys.readouterr()
    assert "running on the CPU (--fallback cpu)" in got.err
    import json
    assert json.loads(got.out)["digest"] == json.loads(want)["digest"]
