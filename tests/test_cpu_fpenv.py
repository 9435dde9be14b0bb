"""The CPU side of the float contract (backends/cpu/fpenv.py): NumPy and a
compiled numba kernel compute vkspec/ieee.py's cases as IEEE 754 says; a
process with flush-to-zero on (as a -ffast-math library leaves it) is fixed
at load, or refused where the fix cannot reach. The flag changes are made in
subprocesses, never in the test process."""

import json
import os
import subprocess
import sys

import pytest

from vkspec.backends.cpu import fpenv
from vkspec.tiny import make_tiny

if fpenv.control() is None:
    pytest.skip("this platform's float control register is not readable here", allow_module_level=True)


def py(code: str, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_this_process_computes_ieee():
    res = fpenv.check(use_numba=True)
    assert res.ok and res.control.ieee, res.line()


def test_flush_to_zero_changes_numpy_and_numba_bits():
    """What the check is for: with FTZ/DAZ on, both NumPy and numba flush the
    denormal cases (the check names them)."""
    r = py("from vkspec.backends.cpu import fpenv\n"
           "assert fpenv.set_flush(True) and fpenv.control().ftz and fpenv.control().daz\n"
           "res = fpenv.check(use_numba=True)\n"
           "print(len(res.numpy), len(res.numba), res.line())")
    assert r.returncode == 0, r.stderr
    n_numpy, n_numba, line = r.stdout.split(" ", 2)
    assert int(n_numpy) > 0 and int(n_numba) > 0 and "denormal" in line and "FTZ+DAZ" in line


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"), seed=4, mtp=True)


RUN = "from vkspec import cli\nimport sys\nsys.exit(cli.main(['run', {d!r}, '--prompt-ids', '5,9,14,200,33', " \
      "'-n', '12', '--backend', 'cpu', '--spec', 'mtp', '--json']))"


def test_a_process_with_flush_to_zero_is_fixed_at_load(tiny_dir, tmp_path):
    cache = {"XDG_CACHE_HOME": str(tmp_path)}
    clean = py(RUN.format(d=str(tiny_dir)), **cache)
    assert clean.returncode == 0, clean.stderr
    ftz = py("from vkspec.backends.cpu import fpenv\nassert fpenv.set_flush(True)\n" + RUN.format(d=str(tiny_dir)),
             **cache)
    assert ftz.returncode == 0, ftz.stderr
    assert "FTZ+DAZ" in ftz.stderr and "turned off" in ftz.stderr
    assert json.loads(ftz.stdout)["digest"] == json.loads(clean.stdout)["digest"]


def test_numba_workers_started_under_flush_to_zero_are_refused():
    """numba's worker threads copy the flags of the thread that starts them;
    started before the fix, they keep flushing: vkspec refuses with one line."""
    r = py("from vkspec.backends.cpu import fpenv\n"
           "from vkspec.errors import VkspecError\n"
           "fpenv.set_flush(True)\n"
           "fpenv.numba_results()\n"
           "try:\n"
           "    fpenv.ensure_ieee()\n"
           "except VkspecError as e:\n"
           "    print('refused:', e)\n", NUMBA_NUM_THREADS="2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused: the CPU does not compute float32") and "numba:" in r.stdout
    assert r.stdout.count("\n") == 1


def test_a_device_model_loads_neither_numba_nor_llvmlite(tiny_dir):
    """A device run computes nothing with numba (the sampler is NumPy), so it
    must not pay numba's and llvmlite's ~70 MB of RSS for the float check;
    the check still runs for NumPy."""
    r = py("import sys\nfrom vkspec.loader import load_model\nfrom vkspec.backends.cpu import fpenv\n"
           f"m = load_model({str(tiny_dir)!r}, backend='vulkan')\n"
           "print(fpenv._checked.ok, fpenv._checked.numba_checked, 'numba' in sys.modules, 'llvmlite' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "False", "False"]


def test_a_later_load_that_runs_numba_checks_it():
    r = py("from vkspec.backends.cpu import fpenv\n"
           "a = fpenv.ensure_ieee(numba=False)\nprint(a.numba_checked)\n"
           "fpenv.set_flush(True)\nfpenv.numba_results()\n"
           "from vkspec.errors import VkspecError\n"
           "try:\n    fpenv.ensure_ieee()\nexcept VkspecError as e:\n    print('refused:', e)\n",
           NUMBA_NUM_THREADS="2")
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first == "False" and second.startswith("refused:") and "numba:" in second


def test_with_numba_off_the_check_runs_once():
    """VKSPEC_CPU_JIT=0 leaves numba unchecked: that is the answer, not a
    reason to check again at every load."""
    r = py("from vkspec.backends.cpu import fpenv\n"
           "a = fpenv.ensure_ieee()\nprint(a.numba_checked, fpenv.ensure_ieee() is a)", VKSPEC_CPU_JIT="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]
