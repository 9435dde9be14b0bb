"""The dense chain against the NumPy path (a script, not a timed test):
decode tok/s, T(n)/T(1) for verify blocks n = 1..8, and the host share of a
decode step, for the tiny model and a ~20M-parameter one. Measured side by
side in one run; ratios are what carries over between machines."""

import sys
import tempfile

from bench_decode import CONFIGS, backends_arg

from vkspec import bench
from vkspec.loader import load_model
from vkspec.tiny import make_tiny


def main():
    """bench_chain.py [FORMAT ...] [--backends cpu,vulkan]"""
    args = sys.argv[1:]
    backends = backends_arg(args)
    fmts = args or ["f32", "int8"]
    print(f"{'model':<6}{'dtype':<10}{'backend':<8}{'tok/s':>7}{'host':>7}  T(n)/T(1), n = 1..8")
    for name, kw in CONFIGS.items():
        with tempfile.TemporaryDirectory() as d:
            make_tiny(d, seed=0, **kw)
            for fmt in fmts:
                for backend in backends:
                    r = bench.run(load_model(d, fmt=fmt, backend=backend), reps=7)
                    ratios = " ".join(f"{v:4.2f}" for v in r["t_ratio"].values())
                    print(f"{name:<6}{fmt:<10}{backend:<8}{r['decode_tok_s']:7.1f}"
                          f"{r['host_share']:7.1%}  {ratios}", flush=True)


if __name__ == "__main__":
    main()
