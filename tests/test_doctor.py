"""`vkspec doctor`: one line per item, each with a verdict."""

import os
import subprocess
import sys

from vkspec.backends.cpu.isa import isa, kernel_choice
from vkspec.doctor import VERDICTS
from vkspec.tiny import make_tiny


def doctor(*args, env=None):
    return subprocess.run([sys.executable, "-m", "vkspec.cli", "doctor", *args], capture_output=True, text=True,
                          timeout=300, env=env or os.environ)


def items(out: str) -> dict:
    found = {}
    for line in out.splitlines():
        verdict, rest = line.split(None, 1)
        assert verdict in VERDICTS, line
        what = next(w for w in ("float controls", "device probe", "cpu float", "cpu q8", "cpu pages", "kp wheels",
                                "numba cache", "vulkan", "gpu", "cpu", "kp", "cache", "counts") if rest.startswith(w))
        assert what not in found, f"{what} twice"
        found[what] = (verdict, rest[len(what):].strip())
    return found


def test_doctor_on_this_machine(vk, tmp_path):
    d = make_tiny(tmp_path / "tiny", seed=4)
    r = doctor(str(d), env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert r.returncode == 0, r.stdout + r.stderr
    got = items(r.stdout)
    assert set(got) == {"vulkan", "gpu", "float controls", "device probe", "cpu", "cpu q8", "cpu float",
                        "cpu pages", "kp", "kp wheels", "cache", "numba cache", "counts"}
    for what in ("vulkan", "device probe", "cpu", "cpu float", "kp"):
        assert got[what][0] == "ok", (what, got[what])
    from vkspec.backends.vulkan import vkinfo
    dev = vkinfo.device(int(os.environ.get("VKSPEC_DEVICE", "0")))
    assert dev.name in got["vulkan"][1] and dev.driver_name in got["vulkan"][1]
    assert got["gpu"][0] == ("ok" if dev.is_gpu else "warn")
    assert "48 cases as IEEE 754" in got["device probe"][1] and "48 cases" in got["cpu float"][1]
    assert isa().name in got["cpu"][1]
    assert str(tmp_path / "xdg" / "vkspec" / "models") in got["counts"][1]


def test_doctor_without_a_vulkan_device(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VK_INSTANCE_LAYERS", "VKSPEC_VK_LOG")}
    env["VK_ICD_FILENAMES"] = env["VK_DRIVER_FILES"] = str(tmp_path / "none.json")
    env["VKSPEC_HUGE_PAGES"] = "0"
    r = doctor(env=env)
    assert r.returncode == 1
    got = items(r.stdout)
    assert got["vulkan"][0] == "fail" and "device probe" not in got
    assert got["cpu"][0] == "ok" and got["cpu float"][0] == "ok"
    assert got["cpu pages"] == ("info", "4 KB (VKSPEC_HUGE_PAGES=0)")


def test_kernel_choice_names_the_cpu_vector_width():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith(("flags", "Features")):
                flags = set(line.split(":", 1)[1].split())
                break
    i = isa()
    want = {"avx512f": 512, "avx2": 256}
    for flag, bits in want.items():
        if flag in flags:
            assert i.vector_bits == bits
            break
    assert kernel_choice().isa == i and "numba" in kernel_choice().line()
    from vkspec.backends.cpu import qdot
    want_q8 = "avx512" if "avx512_vnni" in flags else "avxvnni" if "avx_vnni" in flags else \
        "avx2" if {"avx2", "fma", "f16c"} <= flags else "plain"
    assert qdot.variant() == want_q8
