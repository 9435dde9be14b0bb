"""The `vkspec` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

UNSUPPORTED_SPEC = ("draft-model", "dflash", "dspark")


def _run(args) -> int:
    from .generate import generate
    from .model import load_model
    from .sampling import Sampler
    from .tokenizer import load_tokenizer
    if args.spec in UNSUPPORTED_SPEC:
        print(f"vkspec: --spec {args.spec} is not available: no compatible draft artifact or "
              "graph exists for it (vkspec never substitutes another algorithm)", file=sys.stderr)
        return 2
    if args.spec != "off":
        print(f"vkspec: --spec {args.spec} is not implemented yet (issue 5)", file=sys.stderr)
        return 2
    model = load_model(args.model, fmt=args.dtype, backend=args.backend, device_gb=args.device_gb)
    tok = None
    if args.prompt_ids is not None:
        try:
            prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError:
            print(f"vkspec: --prompt-ids must be comma-separated integers", file=sys.stderr)
            return 2
    else:
        tok = load_tokenizer(args.model)
        prompt = tok.encode(args.prompt or "")
    if not prompt:
        print("vkspec: empty prompt", file=sys.stderr)
        return 2
    sampler = Sampler(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    res = generate(model, prompt, args.n, sampler, stop=set(model.cfg.eos_token_id) if args.stop_eos else None)
    if tok is None:
        try:
            tok = load_tokenizer(args.model)
        except Exception:
            tok = None
    text = tok.decode(res.tokens) if tok else ""
    print(f"[vkspec] run: {len(res.tokens)} tokens, {res.forwards} forwards, "
          f"1.00 tokens/forward | prefill {res.prefill_s:.3f} s | decode {res.decode_tok_s:.1f} tok/s",
          file=sys.stderr)
    if args.json:
        print(json.dumps({"tokens": res.tokens, "text": text, "digest": res.digest,
                          "forwards": res.forwards, "drafted": res.drafted, "accepted": res.accepted,
                          "decode_tok_s": res.decode_tok_s, "prefill_s": res.prefill_s,
                          "prompt_tokens": len(prompt), "backend": args.backend, "dtype": args.dtype}))
    else:
        print(text if tok else " ".join(map(str, res.tokens)))
    return 0


def _bench(args) -> int:
    from . import bench
    from .model import load_model
    if not args.verify_cost:
        print("vkspec: bench needs --verify-cost (the speculative benchmark comes with issue 7)",
              file=sys.stderr)
        return 2
    model = load_model(args.model, fmt=args.dtype, backend=args.backend, device_gb=args.device_gb)
    out = bench.run(model, reps=args.reps)
    out["dtype"] = args.dtype
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.backend} {args.dtype}: decode {out['decode_tok_s']:.1f} tok/s, "
              f"host share {out['host_share']:.1%}")
        print("n          " + " ".join(f"{n:>6}" for n in out["t_ratio"]))
        print("T(n)/T(1)  " + " ".join(f"{v:6.2f}" for v in out["t_ratio"].values()))
    return 0


def _make_tiny(args) -> int:
    from .tiny import make_tiny
    out = make_tiny(Path(args.dir), seed=args.seed, mtp=args.mtp, experts=args.experts,
                    hidden=args.hidden, layers=args.layers, vocab=args.vocab)
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vkspec", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("selftest", help="the exact core on the device against the CPU, byte for byte")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("make-tiny", help="write a deterministic tiny checkpoint")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mtp", action="store_true")
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)

    p = sub.add_parser("run", help="generate")
    p.add_argument("model")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt")
    g.add_argument("--prompt-ids")
    p.add_argument("-n", type=int, default=32)
    p.add_argument("--backend", choices=["cpu", "vulkan"], default="cpu")
    p.add_argument("--dtype", choices=["f32", "int8", "int4-g64"], default="f32")
    p.add_argument("--device-gb", type=float, default=None,
                   help="device memory budget for the dense chain (default: unlimited; VKSPEC_DEVICE_GB)")
    p.add_argument("--spec", choices=["off", "lookup", "mtp", "auto", *UNSUPPORTED_SPEC], default="off")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-eos", action="store_true")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("bench", help="verify-block cost T(n)/T(1), host share, decode tok/s")
    p.add_argument("model")
    p.add_argument("--verify-cost", action="store_true")
    p.add_argument("--backend", choices=["cpu", "vulkan"], default="vulkan")
    p.add_argument("--dtype", choices=["f32", "int8", "int4-g64"], default="f32")
    p.add_argument("--device-gb", type=float, default=None)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--json", action="store_true")

    args = ap.parse_args(argv)
    from .device import DeviceError
    from .errors import VkspecError
    try:
        if args.cmd == "selftest":
            from .selftest import main as selftest
            return selftest(args.seed)
        if args.cmd == "make-tiny":
            return _make_tiny(args)
        if args.cmd == "run":
            return _run(args)
        if args.cmd == "bench":
            return _bench(args)
    except (VkspecError, DeviceError) as e:   # one clear line, no traceback
        print(f"vkspec: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
