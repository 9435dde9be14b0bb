"""CPU decode tok/s for the tiny model and a ~20M-parameter configuration (a script)."""

import sys
import tempfile
import time

import numpy as np

from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.weights import qweights as _qweights
from vkspec.tiny import make_tiny

CONFIGS = {
    "tiny": dict(),
    "20M": dict(hidden=384, layers=8, vocab=8192, experts=8, top_k=2, heads=6, kv_heads=2,
                head_dim=64, k_heads=2, v_heads=4, dk=64, dv=64, inter=1024, moe_inter=128,
                shared=256),
}


def backends_arg(args: list[str]) -> tuple[str, ...]:
    """Take `--backends cpu,vulkan` out of args (both by default)."""
    if "--backends" not in args:
        return ("cpu", "vulkan")
    i = args.index("--backends")
    backends = tuple(args[i + 1].split(","))
    del args[i:i + 2]
    return backends


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    for name, kw in CONFIGS.items():
        with tempfile.TemporaryDirectory() as d:
            make_tiny(d, seed=0, **kw)
            for fmt in ("f32", "int8", "int4-g64"):
                m = load_model(d, fmt=fmt)
                params = sum(a.size for a in [m.w.embed]) + sum(
                    q.rows * q.cols for q in _qweights(m.w))
                r = generate(m, list(range(1, 17)), n)
                print(f"{name:<5} {params / 1e6:6.1f}M params  {fmt:<9} decode {r.decode_tok_s:7.1f} tok/s "
                      f"(prefill 16 tokens {r.prefill_s * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
