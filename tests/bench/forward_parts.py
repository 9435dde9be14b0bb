"""Where a CPU forward's time goes: each compiled kernel timed around its
calls, the rest (Python, NumPy, the calls' own dispatch) by difference.

    python tests/bench/forward_parts.py MODEL.gguf [--rows 1,5,8] [--repeat 30] [--activations f32] [--prefill]

After a 186-row prefill (random ids), each row count is fed `repeat` times
on top of it and rewound, so every forward sees the same cache length: as a
verify block (every row's logits, the recurrent state kept after each row),
or with --prefill as a prompt's block (no copies, the last row's logits). A
timer wrapper costs ~1 us a call (~0.3 ms of a forward): read the columns
side by side, on one machine, in one run.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from vkspec.backends.cpu import jit, jit_attend, jit_blocks, jit_math, qdot
from vkspec.loader import load_model

KERNELS = ((qdot, "gemvs", "q8 GEMVs"), (qdot, "gemvs_each", "q8 GEMVs"), (jit_blocks, "_gemv", "block GEMVs"), (jit, "_gemv", "f32 GEMVs"), (jit_attend, "_attend", "attention"),
           (jit_math, "_rms_rows", "norms"), (jit_math, "_rope_rows", "RoPE"),
           (jit_math, "_elementwise_kernel", "activations"), (jit_math, "_softmax_rows", "softmax"),
           (jit_math, "_deltanet_scan", "DeltaNet"), (jit_math, "_deltanet_scan_fused", "DeltaNet"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rows", default="1,5,8")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--activations", default="q8")
    ap.add_argument("--prefill", action="store_true", help="rows fed as a prompt's block, not a verify block")
    args = ap.parse_args()
    m = load_model(args.model, backend="cpu", ctx=1024, activations=args.activations)
    m.warm()
    spent, calls = collections.defaultdict(float), collections.Counter()
    for mod, name, label in KERNELS:
        f = getattr(mod, name)

        def timed(*a, f=f, label=label):
            t = time.perf_counter()
            out = f(*a)
            spent[label] += time.perf_counter() - t
            calls[label] += 1
            return out
        setattr(mod, name, timed)
    st, rng = m.new_state(), np.random.default_rng(0)
    m.forward(rng.integers(0, 1000, 186).tolist(), st, logits_rows="last")
    labels = list(dict.fromkeys(label for *_, label in KERNELS))      # a label may time several kernels
    print("| rows | forward | " + " | ".join(labels) + " | the rest |")
    print("| --- " * (len(labels) + 3) + "|")
    for n in (int(r) for r in args.rows.split(",")):
        spent.clear()
        calls.clear()
        total = 0.0
        for _ in range(args.repeat):
            t = time.perf_counter()
            ids = rng.integers(0, 1000, n).tolist()
            if args.prefill:
                m.forward(ids, st, logits_rows="last")
            else:
                m.forward(ids, st, copies=True)
            total += time.perf_counter() - t
            m.rewind(st, 0)
        ms = {k: v / args.repeat * 1e3 for k, v in spent.items()}
        rest = total / args.repeat * 1e3 - sum(ms.values())
        cells = [f"{ms.get(label, 0.0):.2f} ({calls[label] // args.repeat})" for label in labels]
        print(f"| {n} | {total / args.repeat * 1e3:.2f} ms | " + " | ".join(cells) + f" | {rest:.2f} |")


if __name__ == "__main__":
    main()
