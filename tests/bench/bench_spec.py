"""Speculative decoding against plain decoding on a repeating prompt (a script):
tokens per forward and decode tok/s, side by side in one run, on the NumPy
path and the Vulkan chain. The model is make-tiny's echo model (its greedy
output walks 8-token cycles, as repetitive text does); the 20M one has the
bench_decode 20M shape."""

import sys
import tempfile

from bench_decode import CONFIGS, backends_arg

from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.sampling import Sampler
from vkspec.speculative import SpecConfig, generate_spec
from vkspec.speculative.sources import build
from vkspec.tiny import make_tiny

PROMPT = [40, 41, 42, 43, 44, 45, 46, 47] * 4 + [3, 17]


def main():
    """bench_spec.py [N] [--backends cpu,vulkan]"""
    args = sys.argv[1:]
    backends = backends_arg(args)
    n = int(args[0]) if args else 96
    print(f"{'model':<6}{'backend':<8}{'spec':<8}{'tok/fwd':>8}{'tok/s':>8}{'x plain':>8}  acceptance")
    for name, kw in CONFIGS.items():
        with tempfile.TemporaryDirectory() as d:
            make_tiny(d, seed=0, mtp=True, echo=True, **kw)
            for backend in backends:
                model = load_model(d, backend=backend)
                if hasattr(model, "warm"):
                    model.warm(len(PROMPT) + n + 8, copies=7)       # records every decoding shape
                generate(model, PROMPT, 8)
                plain = generate(model, PROMPT, n)
                base = plain.decode_tok_s
                print(f"{name:<6}{backend:<8}{'off':<8}{n / plain.forwards:8.2f}{base:8.1f}{1:8.2f}", flush=True)
                for mode in ("lookup", "mtp", "auto"):
                    cfg = SpecConfig(spec_mode=mode)
                    sources, gate = build(model, cfg)
                    generate_spec(model, PROMPT, 16, Sampler(), *build(model, cfg))   # warm up
                    r = generate_spec(model, PROMPT, n, Sampler(), sources, gate)
                    assert r.tokens == plain.tokens and r.digest == plain.digest
                    c = r.counters
                    acc = f"{c.accepted}/{c.drafted}" if c.drafted else "-"
                    print(f"{name:<6}{backend:<8}{mode:<8}{n / r.forwards:8.2f}{r.decode_tok_s:8.1f}"
                          f"{r.decode_tok_s / base:8.2f}  {acc}", flush=True)


if __name__ == "__main__":
    main()
