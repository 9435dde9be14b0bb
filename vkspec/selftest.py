"""`vkspec selftest`: every shader of vkspec/shaders on the device against its
NumPy twin, one op at a time, byte for byte.

The checks (selftest_ops.py, selftest_gemv.py, selftest_mixers.py) name
the shader variant each runs; every .comp file is named by at least one
(tests/test_cli.py holds the report to that).
"""

from __future__ import annotations

import sys
import zlib

import numpy as np

from . import selftest_gemv, selftest_mixers, selftest_ops
from .selftest_ops import EDGE, Check, inputs  # noqa: F401  (the tests take inputs from here)

CHECKS: list[Check] = (selftest_ops.CHECKS + selftest_gemv.CHECKS + selftest_mixers.CHECKS
                       + selftest_ops.ROW_CHECKS)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Byte for byte, except that every NaN equals every NaN (payloads are not part of the contract)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype != np.float32:
        return bool(np.array_equal(a, b))
    eq = a.view(np.uint32) == b.view(np.uint32)
    return bool(np.all(eq | (np.isnan(a) & np.isnan(b))))


def run(check: Check, vk, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """The check's (NumPy's, the device's) pairs; its inputs depend on the
    seed and its name only, so a check gives the same run alone or among all."""
    rng = np.random.default_rng([seed, zlib.crc32(check.name.encode())])
    with np.errstate(all="ignore"):
        return check.run(vk, rng)


def matches(pairs) -> bool:
    return all(same_bits(want, got) for want, got in pairs)


def checks(vk, seed: int = 0):
    """Yield (name, matched) for every check, in order."""
    for c in CHECKS:
        yield c.name, matches(run(c, vk, seed))


def main(seed: int = 0) -> int:
    from .backends import get_ops
    from .errors import VkspecError
    vk = get_ops("vulkan")
    print(f"device: {vk.dev.name} (float modes: {', '.join(vk.dev.float_modes) or 'none'}; "
          f"probe: {vk.dev.probe.line()})")
    bad = 0
    for c in CHECKS:
        try:
            verdict = "byte-identical" if matches(run(c, vk, seed)) else "DIFFERS"
        except VkspecError as e:         # a device failure in one op: the others still run
            verdict = f"FAILED: {e}"
        bad += verdict != "byte-identical"
        print(f"  {c.name:<34} {verdict}", flush=True)
    stems = sorted({c.name.split()[0].split(".")[0] for c in CHECKS})
    print(f"{len(CHECKS)} checks of {len(stems)} shaders: {', '.join(stems)}")
    print("every op byte-identical to the CPU" if not bad else f"{bad} of {len(CHECKS)} checks differ",
          file=sys.stderr)
    return 1 if bad else 0
