import subprocess
import sys

from vkspec import selftest

from test_structure import ROOT


def test_selftest_reports_every_op_identical(vk):
    """Every check byte-identical, and every .comp named in the report: a
    shader added without a selftest check fails here."""
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", "selftest"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "DIFFERS" not in res.stdout and res.stdout.count("byte-identical") == len(selftest.CHECKS)
    lines = [line.split() for line in res.stdout.splitlines() if line.startswith("  ")]
    named = {words[0].split(".")[0] for words in lines}
    stems = {src.stem for src in (ROOT / "shaders").glob("*.comp")}
    assert stems <= named, f"shaders the selftest does not name: {sorted(stems - named)}"
