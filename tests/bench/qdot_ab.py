"""Two builds of the q8 kernel library side by side in one process: the same
calls on the same weights, the libraries alternated round by round, and
whether they gave the same bits.

    python tests/bench/qdot_ab.py gemv MODEL.gguf A.so B.so [--rows 1,16,186]
    python tests/bench/qdot_ab.py forward MODEL.gguf A.so B.so [--rows 186]
    python tests/bench/qdot_ab.py decode MODEL.gguf A.so B.so [--rows 1,8]

gemv times one call of the first layer's MLP gate and up (one input, two
matrices) at each row count (its weights stay in cache: the kernels' arithmetic);
forward times a prompt's forward of random ids from an empty state (the
last row's logits); decode a step of n rows after a 186-token prompt, the
cache rewound after each (every weight read from memory, as in decoding). A library of another commit:
``git worktree add /tmp/old REV`` and ``python /tmp/old/vkspec/backends/cpu/
csrc/build.py``, which prints the paths it built (qdot_avx512_*.so and the
others). Timings on a shared machine move by a tenth or more from run to
run; only the two columns of one run compare.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from vkspec.backends.cpu import qdot


def alternate(libs, chosen, run, rounds):
    """Each library's best time, the median over rounds of B's time over A's
    in that round (a slow spell of a shared host hits both), and whether the
    outputs' bytes agreed: run() under each library in turn."""
    times, outs = [[], []], [set(), set()]
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            chosen[0] = libs[i]
            t = time.perf_counter()
            out = run()
            times[i].append(time.perf_counter() - t)
            outs[i].add(out)
    ratio = float(np.median([b / a for a, b in zip(*times)]))
    return min(times[0]), min(times[1]), ratio, outs[0] == outs[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("gemv", "forward", "decode"))
    ap.add_argument("model")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rows", default=None, help="comma-separated row counts")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    libs = [qdot.open_library(args.a), qdot.open_library(args.b)]
    chosen = [libs[0]]
    qdot.lib = lambda: chosen[0]               # jit_qdot.bind() follows qdot.lib too
    from vkspec.loader import load_model
    m = load_model(args.model, backend="cpu", ctx=1024, activations="q8")
    m.warm()
    rng = np.random.default_rng(0)
    rows = [int(r) for r in (args.rows or {"gemv": "1,16,186", "forward": "186", "decode": "1,8"}[args.what]).split(",")]
    if args.what == "decode":
        st = m.new_state()
        m.forward(rng.integers(0, min(1000, m.cfg.vocab_size), 186).tolist(), st, logits_rows="last")
    print(f"| rows | {args.a} | {args.b} | B / A, best | B / A, median of rounds | same bits |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for n in rows:
        if args.what == "gemv":
            mats = [m.w.layers[0].ffn.gate, m.w.layers[0].ffn.up]
            x = rng.standard_normal((n, mats[0].cols)).astype(np.float32)

            def run():
                return b"".join(y.tobytes() for y in qdot.gemvs(mats, x))
        elif args.what == "decode":
            ids = rng.integers(0, min(1000, m.cfg.vocab_size), n).tolist()

            def run():
                out = m.forward(ids, st, logits_rows="all")[1].tobytes()
                m.rewind(st, 0)
                return out
        else:
            ids = rng.integers(0, min(1000, m.cfg.vocab_size), n).tolist()

            def run():
                return m.forward(ids, m.new_state(), logits_rows="last")[1].tobytes()
        ta, tb, ratio, same = alternate(libs, chosen, run, args.rounds)
        print(f"| {n} | {ta * 1e3:.2f} ms | {tb * 1e3:.2f} ms | {tb / ta:.3f} | {ratio:.3f} | {same} |")


if __name__ == "__main__":
    main()
