import subprocess
import sys


def test_selftest_reports_every_op_identical(vk):
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", "selftest"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "DIFFERS" not in res.stdout and res.stdout.count("byte-identical") >= 35
