"""What speculation on by default costs: `vkspec bench`'s default mode
(auto) against --spec off, each round a fresh process per mode, rounds
interleaved; "cold" gives every process new, empty numba, kernel and Mesa
shader caches (XDG_CACHE_HOME, MESA_SHADER_CACHE_DIR), "warm" shares one set
that a first, untimed round fills.

    python tests/bench/default_cost.py MODEL [--backends cpu,vulkan] [--prompts chat,code-edit]
                                       [--caches cold,warm] [--rounds 5] [-n 64]

Prints decode tok/s medians of auto and off and their ratio per backend,
prompt and cache state; every run of a backend and prompt must give the same digest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def bench(model, backend, prompt, mode, n, cache_dir) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_dir), MESA_SHADER_CACHE_DIR=str(Path(cache_dir) / "mesa"))
    out = subprocess.run([sys.executable, "-m", "vkspec.cli", "bench", model, "--backends", backend, "--modes",
                          mode, "--prompts", prompt, "--rounds", "1", "-n", str(n), "--json"],
                         capture_output=True, text=True, env=env, check=True).stdout
    (row,) = json.loads(out)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--backends", default="cpu,vulkan")
    ap.add_argument("--prompts", default="chat,code-edit")
    ap.add_argument("--caches", default="cold,warm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=64)
    a = ap.parse_args()
    cells = [(b, p, c) for c in a.caches.split(",") for b in a.backends.split(",") for p in a.prompts.split(",")]
    warm_dir = Path(tempfile.mkdtemp(prefix="vkspec-warm-"))
    if "warm" in a.caches.split(","):
        for b in a.backends.split(","):
            bench(a.model, b, "chat", "auto", 8, warm_dir)         # fills the shared caches
    rates: dict[tuple, list] = {}
    digests: dict[tuple, str] = {}
    for rnd in range(a.rounds):
        print(f"round {rnd + 1}/{a.rounds}", file=sys.stderr, flush=True)
        for b, p, c in cells:
            for mode in ("off", "auto") if rnd % 2 == 0 else ("auto", "off"):
                d = warm_dir if c == "warm" else Path(tempfile.mkdtemp(prefix="vkspec-cold-"))
                row = bench(a.model, b, p, mode, a.n, d)
                if digests.setdefault((b, p), row["digest"]) != row["digest"]:
                    sys.exit(f"{b} {p} {c} {mode}: the output differs from another run's")
                rates.setdefault((b, p, c, mode), []).append(row["decode_tok_s"])
    med = statistics.median
    print(f"{Path(a.model).name}: decode tok/s, medians of {a.rounds} interleaved rounds, -n {a.n}\n")
    print("| backend | prompt | caches | default (auto) | off | ratio |\n| --- | --- | --- | --- | --- | --- |")
    for b, p, c in cells:
        on, off = med(rates[(b, p, c, "auto")]), med(rates[(b, p, c, "off")])
        print(f"| {b} | {p} | {c} | {on:.1f} | {off:.1f} | {on / off:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
