"""Benchmark of the device GEMV (a script, not a test).

For each weight format: one recorded GEMV dispatch of an M x K weight (random
values, formats.samples) over n input rows, replayed with eval(); prints the
median time, the GB/s of weight bytes read and T(n)/T(1). With --cpu, the same
for the CPU backend's GEMV. Also the cost of one recorded dispatch. With
--model: forward blocks of n rows on a model's Vulkan chain instead.

Usage: python tests/bench/bench_core.py [--rows 1536] [--cols 1536] [--n 1,3,8]
       [--formats f32,q4_1,...] [--reps 5] [--cpu] [--process-time] [--json]
       python tests/bench/bench_core.py --model MODEL [--n 1,2,4,8] [--process-time]
Run it from two trees (PYTHONPATH=tree) alternately to compare shader versions;
VKSPEC_GEMV_LANES=parallel|serial picks gemv.comp's lane layout.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from vkspec import exact
from vkspec.backends.cpu.ops import CpuOps
from vkspec.backends.vulkan.device import get_device, load_shader
from vkspec.backends.vulkan.memory import Uploader
from vkspec.formats.matrix import FORMATS
from vkspec.formats.samples import random_weight
from vkspec.shaders import push as P


CLOCK = time.perf_counter


def median_time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = CLOCK()
        fn()
        ts.append(CLOCK() - t0)
    return float(np.median(ts))


def gemv_dispatch(dev, variant: str, rows: int):
    """The shader variant and grid the backend uses (trees from before the two
    lane layouts: one invocation per row, 64 a workgroup)."""
    try:
        from vkspec.backends.vulkan.recorder import gemv_dispatch, gemv_layout
    except ImportError:
        return variant, max(1, -(-rows // 64))
    return gemv_dispatch(variant, rows, gemv_layout(dev))


def gemv_spec(dev, variant: str, n: int) -> tuple:
    """The specialization constants the backend passes (none in trees from
    before they existed)."""
    try:
        from vkspec.backends.vulkan.recorder import gemv_layout, gemv_spec
    except ImportError:
        return ()
    return gemv_spec(gemv_layout(dev), n, variant)


def device_gemv(dev, dw, n, keep):
    """A sequence of the GEMV dispatches (one per part) of dw over n rows."""
    cols_p = exact.padded(dw.cols)
    xt = dev.tensor(np.random.default_rng(0).standard_normal((n, cols_p)).astype(np.float32))
    yt = dev.tensor(np.zeros((n, dw.rows), np.float32))
    seq = dev.sequence()
    for part in dw.parts:
        push = P.Gemv(rows=part.rows, cols=dw.cols, nvec=n, x_stride=cols_p, y_stride=dw.rows,
                      y_off=part.first_row, row_bytes=part.row_bytes, s_stride=part.s_stride)
        variant, groups = gemv_dispatch(dev, part.variant, part.rows)
        algo = dev.algorithm(load_shader("gemv", variant), [part.data, part.scales, xt, yt], groups, push,
                             gemv_spec(dev, part.variant, n))
        keep.append(algo)
        seq.record(dev.kp.OpAlgoDispatch(algo))
    keep += [xt, yt, seq]
    return seq.eval


def model_steps(path: str, reps: int, rows: list[int]) -> dict:
    """Forward blocks of n rows on a model's Vulkan chain (bench.verify_cost's
    protocol: 140 prompt tokens, a block of n rows, rewind to one): median
    CPU seconds of the process per block (--process-time) or wall seconds."""
    from vkspec.loader import load_model
    model = load_model(path, backend="vulkan")
    rng = np.random.default_rng(0)
    st = model.new_state()
    prompt = [int(t) for t in rng.integers(1, model.cfg.vocab_size, 140)]
    for i in range(0, len(prompt), model.max_rows):
        model.forward(prompt[i:i + model.max_rows], st)
    times = {n: [] for n in rows}
    for rep in range(reps + 1):                  # the first round records the sequences
        for n in rows:
            block = [int(t) for t in rng.integers(1, model.cfg.vocab_size, n)]
            t0 = CLOCK()
            model.forward(block, st, copies=True)
            if rep:
                times[n].append(CLOCK() - t0)
            model.rewind(st, 1)
    return {str(n): float(np.median(v)) for n, v in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1536)
    ap.add_argument("--cols", type=int, default=1536)
    ap.add_argument("--n", default="1,3,8")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="the CPU backend's GEMV too")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--process-time", action="store_true",
                    help="time the process's CPU seconds (all of Lavapipe's threads) instead of the "
                         "wall clock: steadier on a machine that other work shares")
    ap.add_argument("--model", help="time forward blocks of a model instead (a checkpoint or .gguf)")
    args = ap.parse_args()
    if args.process_time:
        global CLOCK
        CLOCK = time.process_time
    if args.model:
        t = model_steps(args.model, args.reps, [int(v) for v in args.n.split(",")])
        print(json.dumps({"model/vulkan": t}) if args.json else
              "  ".join(f"T({n}) {v * 1e3:.1f} ms" for n, v in t.items()))
        return
    dev = get_device()
    ns = [int(v) for v in args.n.split(",")]
    rng = np.random.default_rng(0)
    results = {}
    if not args.json:
        print(f"device: {dev.name}; GEMV {args.rows}x{args.cols}, median of {args.reps}")
        print(f"{'format':<10}{'backend':<9}" + "".join(f"{f'T({n}) ms':>11}" for n in ns)
              + f"{'GB/s(1)':>9}  T(n)/T(1)")
    for fmt in args.formats.split(","):
        w = random_weight(fmt, args.rows, args.cols, rng)
        nbytes = w.data.nbytes + w.scales.nbytes
        backends = {"vulkan": None}
        if args.cpu:
            backends["cpu"] = None
        for name in backends:
            times, keep = [], []
            if name == "vulkan":
                dw = Uploader(dev).weight("w", [w])
                for n in ns:
                    times.append(median_time(device_gemv(dev, dw, n, keep), args.reps))
            else:
                cpu, x8 = CpuOps(), rng.standard_normal((8, args.cols)).astype(np.float32)
                for n in ns:
                    times.append(median_time(lambda: cpu.gemv(w, x8[:n]), args.reps))
            results[f"{fmt}/{name}"] = {str(n): t for n, t in zip(ns, times)}
            if not args.json:
                ratios = " ".join(f"{t / times[0]:.2f}" for t in times)
                print(f"{fmt:<10}{name:<9}" + "".join(f"{t * 1e3:11.2f}" for t in times)
                      + f"{nbytes / times[0] / 1e9:9.3f}  {ratios}", flush=True)
    if args.json:
        print(json.dumps(results))
        return

    x, y = dev.tensor(np.ones(64, np.float32)), dev.tensor(np.zeros(64, np.float32))
    algo = dev.algorithm(load_shader("core_eval"), [x, y], 1, P.CoreEval(n=64, op=0))
    seqs = {}
    for count in (1, 201):
        s = dev.sequence()
        for _ in range(count):
            s.record(dev.kp.OpAlgoDispatch(algo))
        seqs[count] = s
    t1 = median_time(seqs[1].eval, args.reps * 4)
    t201 = median_time(seqs[201].eval, args.reps * 4)
    print(f"one recorded dispatch: {(t201 - t1) / 200 * 1e6:.1f} us; "
          f"one eval() of a 1-dispatch sequence: {t1 * 1e6:.1f} us")


if __name__ == "__main__":
    main()
