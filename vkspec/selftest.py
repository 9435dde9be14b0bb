"""`vkspec selftest`: every exact-core op on the device against NumPy, byte for byte."""

from __future__ import annotations

import sys

import numpy as np

from . import exact
from .formats.matrix import FORMATS
from .formats.samples import random_weight

EDGE = np.array([0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 1e-40, 1.17549435e-38, 3.4e38, -3.4e38,
                 np.inf, -np.inf, np.nan, 88.72, 88.73, -87.3, -103.0, -104.5, 20.0, 20.5,
                 1e-7, 1e7], dtype=np.float32)


def inputs(seed: int, n: int = 4096) -> np.ndarray:
    rng = np.random.default_rng(seed)
    wide = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    return np.concatenate([EDGE, wide, rng.uniform(-30, 30, n).astype(np.float32)])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Byte for byte, except that every NaN equals every NaN (payloads are not part of the contract)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype != np.float32:
        return bool(np.array_equal(a, b))
    eq = a.view(np.uint32) == b.view(np.uint32)
    return bool(np.all(eq | (np.isnan(a) & np.isnan(b))))


def checks(cpu, vk, seed: int = 0):
    """Yield (name, matched) for every op of the core."""
    x = inputs(seed)
    for op, f in enumerate(exact.ELEMENTWISE):
        yield f.__name__, same_bits(cpu.core_eval(x, op), vk.core_eval(x, op))
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((8, 512)).astype(np.float32)
    for fmt in FORMATS:
        w = random_weight(fmt, 96, 512, rng)
        for n in (1, 3, 8):
            yield f"gemv {fmt} x{n}", same_bits(cpu.gemv(w, xs[:n]), vk.gemv(w, xs[:n]))
    rows = (rng.standard_normal((6, 1000)) * 3).astype(np.float32)
    w = rng.standard_normal(1000).astype(np.float32)
    yield "rmsnorm", same_bits(cpu.rmsnorm(rows, w, 1e-6), vk.rmsnorm(rows, w, 1e-6))
    yield "softmax", same_bits(cpu.softmax(rows), vk.softmax(rows))
    yield "argmax", same_bits(cpu.argmax(rows), vk.argmax(rows))


def main(seed: int = 0) -> int:
    from .backends import get_ops
    cpu, vk = get_ops("cpu"), get_ops("vulkan")
    print(f"device: {vk.dev.name} (float modes: {', '.join(vk.dev.float_modes) or 'none'}; "
          f"probe: {vk.dev.probe.line()})")
    bad = 0
    for name, ok in checks(cpu, vk, seed):
        bad += not ok
        print(f"  {name:<22} {'byte-identical' if ok else 'DIFFERS'}")
    print("all ops byte-identical to the CPU" if not bad else f"{bad} ops differ", file=sys.stderr)
    return 1 if bad else 0
