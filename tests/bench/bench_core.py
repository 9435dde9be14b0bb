"""Benchmark of the exact core (a script, not a test).

Prints, for the Vulkan device and the NumPy path: GEMV throughput (GB/s of
weights) for 2048x2048 f32 / int8 / int4-g64, the multi-row GEMV ratio
T(n)/T(1) for n = 1..8, and the cost of one recorded dispatch.
Usage: python tests/bench/bench_core.py [--size 2048] [--reps 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from vkspec.formats import quant
from vkspec.backends.cpu.ops import CpuOps
from vkspec.backends.vulkan.device import get_device, load_shader


def median_time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def device_gemv(dev, w, n):
    scales = w.scales if w.scales.size else np.zeros(1, np.float32)
    tw, ts = dev.tensor(w.data, "storage"), dev.tensor(scales, "storage")
    tx = dev.tensor(np.random.default_rng(0).standard_normal((n, w.cols_p)).astype(np.float32))
    ty = dev.tensor(np.zeros((n, w.rows), np.float32))
    algo = dev.algorithm(load_shader("gemv", w.variant), [tw, ts, tx, ty], -(-w.rows // 64),
                         dict(rows=w.rows, cols=w.cols_p, nvec=n, x_stride=w.cols_p, y_stride=w.rows))
    seq = dev.sequence()
    seq.record(dev.dispatch(algo))
    dev.upload(tx)
    return seq.eval


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    dev, cpu = get_device(), CpuOps()
    k = args.size
    rng = np.random.default_rng(0)
    w32 = rng.standard_normal((k, k)).astype(np.float32)
    print(f"device: {dev.name}; GEMV {k}x{k}, median of {args.reps}")
    print(f"{'format':<10}{'backend':<9}{'T(1) ms':>9}{'GB/s':>7}  T(n)/T(1) for n=1..8")
    for fmt in quant.FORMATS:
        w = quant.quantize(w32, fmt)
        x8 = rng.standard_normal((8, k)).astype(np.float32)
        for name in ("vulkan", "numpy"):
            times = []
            for n in range(1, 9):
                if name == "vulkan":
                    times.append(median_time(device_gemv(dev, w, n), args.reps))
                else:
                    times.append(median_time(lambda: cpu.gemv(w, x8[:n]), args.reps))
            gbs = w.nbytes() / times[0] / 1e9
            ratios = " ".join(f"{t / times[0]:.2f}" for t in times)
            print(f"{fmt:<10}{name:<9}{times[0] * 1e3:9.2f}{gbs:7.2f}  {ratios}")

    x, y = dev.tensor(np.ones(64, np.float32)), dev.tensor(np.zeros(64, np.float32))
    algo = dev.algorithm(load_shader("core_eval"), [x, y], 1, dict(n=64, op=0))
    seqs = {}
    for count in (1, 201):
        s = dev.sequence()
        for _ in range(count):
            s.record(dev.dispatch(algo))
        seqs[count] = s
    t1 = median_time(seqs[1].eval, args.reps * 4)
    t201 = median_time(seqs[201].eval, args.reps * 4)
    print(f"one recorded dispatch (with its barrier): {(t201 - t1) / 200 * 1e6:.1f} us; "
          f"one eval() of a 1-dispatch sequence: {t1 * 1e6:.1f} us")


if __name__ == "__main__":
    main()
