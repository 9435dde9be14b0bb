"""The rate at which a decode row's expert GEMVs read their weights from
memory: k random experts of every layer in turn (a file's experts are far
larger than the caches), through the compiled one-row call
(expert_table._experts), against the bytes of the experts picked.

    python tests/bench/expert_rate.py MODEL.gguf [--reps 20]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from vkspec.backends.cpu import expert_table, jit_qdot, qdot
from vkspec.loader import load_model
from vkspec.weights import MoeW


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    m = load_model(args.model, backend="cpu", ctx=256, activations="q8")
    moes = [lw.ffn for lw in m.w.layers if isinstance(lw.ffn, MoeW) and expert_table.all_q8(lw.ffn)]
    if not moes:
        raise SystemExit(f"{args.model}: no MoE layer whose experts take q8")
    tables = [expert_table.tables(w, None) for w in moes]
    rng, k = np.random.default_rng(0), m.cfg.num_experts_per_tok
    jit_qdot.bind()

    def run(reps):
        nbytes, t = 0, time.perf_counter()
        for _ in range(reps):
            for w, tb in zip(moes, tables):
                picked = rng.choice(len(w.experts), k, replace=False).astype(np.int64)
                h = rng.standard_normal((1, m.cfg.hidden_size)).astype(np.float32)
                expert_table._experts(tb.gu, tb.down, picked, h, tb.inter, qdot.THREADS)
                nbytes += sum(q.data.nbytes for e in picked for q in (w.experts[e].gate, w.experts[e].up,
                                                                       w.experts[e].down))
        return time.perf_counter() - t, nbytes
    run(2)
    best = max(nbytes / dt for dt, nbytes in (run(args.reps) for _ in range(5)))
    print(f"{args.model}: {k} experts a row, {len(moes)} layers, {qdot.THREADS} threads: best {best / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
