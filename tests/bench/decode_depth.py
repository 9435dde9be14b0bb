"""Decode rate at depth: vkspec's CPU decode step next to llama-bench's, after
prompts of several lengths, rounds interleaved; prints one markdown table.

    python tests/bench/decode_depth.py MODEL.gguf [--depths 186,1000,3000] [-n 32] [--rounds 2] [--peer DIR]

llama.cpp: ``llama-bench -p 0 -n N -d DEPTH -t 2`` (its CPU backend; it
reports tokens a second of N generated tokens after DEPTH prompt tokens).
vkspec: the same file on the CPU backend (q8, the process's defaults: set
VKSPEC_HUGE_PAGES=0 to measure 4 KB pages), a prompt of DEPTH random ids
fed as one block, then N single-token forwards timed together; a fresh
state each round. Different harnesses around the same file and threads:
neither counts sampling or detokenising.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

from vkspec.loader import load_model

_RATE = re.compile(r"tg\d+ @ d(\d+)\s*\|\s*([\d.]+)")


def llama_rates(peer, model, depths, n) -> dict:
    out = subprocess.run([str(Path(peer) / "llama-bench"), "-m", str(model), "-p", "0", "-n", str(n), "-t", "2",
                          "-r", "1", "-d", ",".join(map(str, depths))], capture_output=True, text=True, check=True).stdout
    return {int(d): float(r) for d, r in _RATE.findall(out)}


def vkspec_rate(model, depth, n) -> float:
    rng = np.random.default_rng(depth)
    st = model.new_state()
    model.forward(rng.integers(0, 1000, depth).tolist(), st, logits_rows="last")
    t = time.perf_counter()
    for i in range(n):
        model.forward([5 + i], st, logits_rows="last")
    return n / (time.perf_counter() - t)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--depths", default="186,1000,3000")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--peer", default=os.environ.get("LLAMA_BIN", str(Path.home() / ".cache/vkspec-peer/build-cpu/bin")))
    a = ap.parse_args()
    depths = [int(d) for d in a.depths.split(",")]
    model = load_model(a.model, backend="cpu", ctx=max(depths) + a.n + 1)
    model.warm()
    ours, theirs = {d: [] for d in depths}, {d: [] for d in depths}
    for _ in range(a.rounds):
        for d, r in llama_rates(a.peer, a.model, depths, a.n).items():
            theirs[d].append(r)
        for d in depths:
            ours[d].append(vkspec_rate(model, d, a.n))
    med = statistics.median
    print(f"{Path(a.model).name}, -n {a.n}, {a.rounds} interleaved rounds, medians (tok/s)\n")
    print("| positions | llama.cpp | vkspec | ratio |\n| --- | --- | --- | --- |")
    for d in depths:
        print(f"| {d} | {med(theirs[d]):.2f} | {med(ours[d]):.2f} | {med(ours[d]) / med(theirs[d]):.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
