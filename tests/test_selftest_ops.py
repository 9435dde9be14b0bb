"""Every shader variant the selftest runs, one test per check: the device's
output buffers against the NumPy twin's, byte for byte (vkspec/selftest.py
same_bits: NaN payloads excepted). And the checks themselves: they cover
every shader and variant, and each one fails on a device that does nothing."""

import numpy as np
import pytest

from vkspec import selftest
from vkspec.backends.cpu import jit as cpu_jit, ops
from vkspec.backends.vulkan.immediate import VulkanOps
from vkspec.formats.intform import Q8_FORMATS
from vkspec.formats.matrix import FORMATS
from vkspec.selftest_ops import Check
from vkspec.shaders import build

from conftest import bits_equal
from test_structure import ROOT

BY_NAME = {c.name: c for c in selftest.CHECKS}


@pytest.mark.parametrize("name", list(BY_NAME))
def test_op(vk, name):
    for want, got in selftest.run(BY_NAME[name], vk):
        bits_equal(want, got)


def test_check_names_are_unique():
    assert len(BY_NAME) == len(selftest.CHECKS)


def test_every_shader_variant_is_checked():
    """Each variant of every .comp by name ("<stem>.<variant> ..."), but
    gemv.comp's and gemv_q8.comp's: there every format plain in both lane
    layouts, and each routed and row-mapped variant for some format."""
    names = [c.name.split()[0] for c in selftest.CHECKS]
    missing = []
    for src in sorted((ROOT / "shaders").glob("*.comp")):
        variants = [n[:-4] for n in build.variants(src)]
        if src.stem in ("gemv", "gemv_q8"):
            formats = FORMATS if src.stem == "gemv" else Q8_FORMATS
            want = [f"{src.stem}.{FORMATS[f].variant}{s}" for f in formats for s in ("", "_serial")]
            missing += [w for w in want if w not in names]
            for kind in ("_routed", "_routed_serial", "_rowmap", "_rowmap_serial"):
                if not any(n.startswith(src.stem + ".") and n.endswith(kind) for n in names):
                    missing.append(f"{src.stem}.*{kind}")
        else:
            missing += [v for v in variants if v not in names]
    assert not missing, f"no selftest check runs {missing}"


class Idle(VulkanOps):
    """Runs no shader: every buffer comes back as it went."""

    def dispatch(self, op, variant, grid, push, spec=(), read=(), **buffers):
        return [np.array(buffers[n]) for n in read]


def test_every_check_fails_on_a_device_that_does_nothing(vk):
    idle = Idle.__new__(Idle)
    idle.dev = vk.dev
    passed = [c.name for c in selftest.CHECKS if selftest.matches(selftest.run(c, idle))]
    assert not passed, f"checks that a device doing nothing passes: {passed}"


def test_a_check_that_differs_fails_the_selftest(vk, monkeypatch, capsys):
    f32 = np.float32
    bad = Check("softmax one ulp off", lambda vk, rng: [(np.ones(3, f32), np.nextafter(np.ones(3, f32), f32(2)))])
    monkeypatch.setattr(selftest, "CHECKS", [selftest.CHECKS[0], bad])
    assert selftest.main() == 1
    out = capsys.readouterr().out
    assert "softmax one ulp off" in out and "DIFFERS" in out and "byte-identical" in out


@pytest.mark.parametrize("window", [0, 5, 200])
@pytest.mark.parametrize("compiled", [True, False])
def test_attention_passes_compose_to_attend(window, compiled, monkeypatch):
    """attend.comp's three NumPy passes (the selftest's twins) give
    ops.attend's bits, the compiled path and the definition: keys before a
    window (inf in their values) never count."""
    monkeypatch.setattr(cpu_jit, "ENABLED", compiled)
    rng = np.random.default_rng(window)
    L, n, nh, nkv, hd = 150, 4, 6, 3, 24
    q, kc, vc = (rng.standard_normal(s).astype(np.float32) for s in ((n, nh, hd), (L, nkv, hd), (L, nkv, hd)))
    lens = np.array([1, 100, 129, 150])
    if 0 < window < lens[-1]:
        vc[lens[-1] - window - 1] = np.inf
    scale = np.float32(hd ** -0.5)
    scores = ops.attend_scores(q, kc, lens, scale, window, out=np.full((n, nh, L), np.float32(7)))
    got = ops.attend_out(ops.attend_softmax(scores, lens, window), vc, lens, window)
    bits_equal(got, ops.attend(q, kc, vc, lens, scale, window))
