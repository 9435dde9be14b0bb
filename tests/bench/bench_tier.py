"""The expert tier on Lavapipe (a script): hit rate and decode tok/s against the
budget, for the bench_decode 20M model (8 experts, top-2), int8. Each budget
runs cold (zero history), then warm (from the cold run's saved history).
Every run's digest equals the all-resident run's."""

import sys
import tempfile
from pathlib import Path

from bench_decode import CONFIGS

from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.tier.resident import TierConfig
from vkspec.tiny import make_tiny


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 48
    prompt = [int(t) for t in (3, 17, 250, 99, 1024, 77, 5, 4000, 31, 8, 600, 2)]
    with tempfile.TemporaryDirectory() as d:
        make_tiny(d, seed=0, **CONFIGS["20M"])
        full = load_model(d, fmt="int8", backend="vulkan")
        generate(full, prompt, 4)
        ref = generate(full, prompt, n)
        print(f"all experts resident: {ref.decode_tok_s:.1f} tok/s")
        e = full.w.layers[0].ffn.experts[0]
        per = e.gate.nbytes() + e.up.nbytes() + e.down.nbytes()
        total = sum(len(lw.ffn.experts) for lw in full.w.layers)
        print(f"{'budget':>8}{'slots':>7}{'run':>6}{'hit rate':>10}{'tok/s':>8}{'x all':>7}"
              f"{'uploads/fwd':>12}{'upload ms/fwd':>14}{'cpu ms/fwd':>11}")
        for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
            slots = int(round(frac * total))
            hist = Path(d) / f"usage-{slots}.json"
            for run in ("cold", "warm"):
                tier = TierConfig(budget_gb=slots * per / (1 << 30), rate=2, history=str(hist))
                m = load_model(d, fmt="int8", backend="vulkan", tier=tier)
                generate(m, prompt[:3], 2)                     # record the shapes
                m.tier.reset_stats()
                r = generate(m, prompt, n)
                assert r.digest == ref.digest
                s = m.tier.stats.as_dict()
                print(f"{frac:8.0%}{slots:7d}{run:>6}{s['hit_rate']:10.1%}{r.decode_tok_s:8.1f}"
                      f"{r.decode_tok_s / ref.decode_tok_s:7.2f}{s['uploads'] / max(m.tier.stats.forwards, 1):12.2f}"
                      f"{s['upload_ms_per_forward']:14.2f}{s['host_ms_per_forward']:11.2f}", flush=True)
                m.tier.save_history(hist)


if __name__ == "__main__":
    main()
