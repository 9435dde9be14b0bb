"""The `vkspec` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .cli_load import fallback_for, load_for_spec, spec_config, tier_config
from .speculative.config import UNSUPPORTED as UNSUPPORTED_SPEC


def _tokenizer_for_run(args):
    """The tokenizer, None when the model has none. With --prompt-ids a
    tokenizer that fails to load is reported and the run prints token ids."""
    from .errors import VkspecError
    from .tokenizer import find_tokenizer
    try:
        return find_tokenizer(args.model)
    except VkspecError as e:
        if args.prompt_ids is None:
            raise
        print(f"vkspec: {e}; printing token ids", file=sys.stderr)
        return None


def _stopped(args, tok, e) -> int:
    """The device failed mid-run and there is no fallback: the output up to
    the last commit (a prefix of what the run would have printed), then one
    line on stderr and exit status 2. With --json: the object has the
    committed tokens, their text and digest, and ``error``."""
    from .speculative.result import Result
    tokens = list(e.tokens)
    text = tok.decode(tokens) if tok else ""
    line = f"{e}; stopped after {len(tokens)} tokens (--fallback cpu continues on the CPU)"
    if args.json:
        digest = Result(tokens, e.last).digest if e.last is not None else None
        print(json.dumps({"tokens": tokens, "text": text, "digest": digest, "backend": args.backend,
                          "dtype": args.dtype, "activations": args.activations, "error": line, "stopped": True}))
    else:
        print(text if tok else " ".join(map(str, tokens)))
    sys.stdout.flush()
    print(f"vkspec: {line}", file=sys.stderr)
    return 2


def _fell_back(args, fallback) -> str | None:
    """How the run left the device: "load" (it never ran there), "snapshot"
    or "replay" (how the state came over mid-run), None (it did not)."""
    if getattr(args, "fell_back", None):
        return args.fell_back
    return fallback.moves[0] if fallback is not None and fallback.moves else None


def _prompt(args):
    """The prompt's ids and the tokenizer (None with --prompt-ids)."""
    from .errors import VkspecError
    if args.prompt_ids is not None:
        try:
            prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError:
            raise VkspecError("--prompt-ids must be comma-separated integers") from None
        tok = None
    else:
        tok = _tokenizer_for_run(args)
        if tok is None:
            raise VkspecError(f"{args.model}: no tokenizer.json (use --prompt-ids)")
        prompt = tok.encode(args.prompt or "")
    if not prompt:
        raise VkspecError("empty prompt")
    return prompt, tok


def _run(args) -> int:
    from .errors import DeviceError
    from .sampling import Sampler
    from .speculative import generate_spec
    from .speculative.sources import build, listed_size, save_vocab
    cfg = spec_config(args)
    prompt, tok = _prompt(args)
    tier = tier_config(args, args.model)
    if args.ctx is None:
        # a run knows how many positions it needs: the device's KV cache and
        # attention buffers are sized to them (the model's limit still holds)
        args.ctx = -(-(len(prompt) + args.n + 8) // 64) * 64
    model = load_for_spec(args, cfg, tier)
    fallback = fallback_for(args, model)
    if args.prompt_ids is not None:
        tok = _tokenizer_for_run(args)             # for the text of the output only
    sources, gate = build(model, cfg, args.model)
    sampler = Sampler(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    # compiled kernels and device pipelines are prepared before the clock
    # starts: built lazily, a compile or a pipeline build would land inside
    # the time to first token, the decode time and the gate's T(n)
    spec = cfg.spec_mode != "off"
    t0 = time.perf_counter()
    model.warm(len(prompt) + args.n, cfg.spec_mtp_recurrent_snapshots if spec else 0,
               listed_size(model, cfg) if spec else 0, prompt=len(prompt))
    warm_s = time.perf_counter() - t0
    import signal

    def on_term(signum, frame):                  # the counts are saved on the way out
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    try:
        res = generate_spec(model, prompt, args.n, sampler, sources, gate,
                            snapshots=cfg.spec_mtp_recurrent_snapshots,
                            stop=set(model.cfg.eos_token_id) if args.stop_eos else None, fallback=fallback)
    except DeviceError as e:
        if getattr(e, "tokens", None) is None:     # nothing was generated: the one line is all
            raise
        return _stopped(args, tok, e)
    finally:
        save_vocab(sources)
        if getattr(model, "tier", None) is not None and args.tier_history_out:
            model.tier.save_history(args.tier_history_out)
    _report_run(args, cfg, model, tok, prompt, res, warm_s, gate, sources, fallback)
    return 0


def _report_run(args, cfg, model, tok, prompt, res, warm_s, gate, sources, fallback):
    """The run's lines on stderr, and its text (or --json) on stdout."""
    text = tok.decode(res.tokens) if tok else ""
    c = res.counters
    print(f"[vkspec {cfg.spec_mode}] run: {c.line(len(res.tokens))} | "
          + f"warm-up {warm_s:.2f} s | "
          + f"prefill {res.prefill_s:.3f} s | decode {res.decode_tok_s:.1f} tok/s", file=sys.stderr)
    stats = c.as_dict(gate, sources)
    if getattr(model, "tier", None) is not None:
        stats["tier"] = model.tier.stats.as_dict()
        t = stats["tier"]
        print(f"[vkspec tier] {args.tier_gb} GiB: slots per layer {model.tier.caps}, hit rate "
              f"{t['hit_rate']:.1%} ({t['hits']}/{t['pairs']}), {t['cpu']} on the CPU, {t['streamed']} "
              f"streamed, {t['uploads']} uploads ({t['upload_ms_per_forward']:.2f} ms/forward)",
              file=sys.stderr)
    if gate is not None:
        print(f"[vkspec spec gate] {'on' if gate.enabled else 'off'}, {gate.declined} declined, "
              f"{gate.probes} probes, {gate.forced_plain} forced plain | {gate.summary()}", file=sys.stderr)
    if args.json:
        print(json.dumps({"tokens": res.tokens, "text": text, "digest": res.digest,
                          "forwards": res.forwards, "drafted": res.drafted, "accepted": res.accepted,
                          "decode_tok_s": res.decode_tok_s, "prefill_s": res.prefill_s, "warm_s": warm_s,
                          "tokens_per_forward": len(res.tokens) / max(res.forwards, 1),
                          "prompt_tokens": len(prompt), "backend": args.backend, "dtype": args.dtype,
                          "activations": args.activations,
                          "spec_mode": cfg.spec_mode, "counters": stats,
                          "fallback": _fell_back(args, fallback)}))
    else:
        print(text if tok else " ".join(map(str, res.tokens)))


def _bench(args) -> int:
    from . import bench
    from .loader import load_model
    if not args.verify_cost:
        from .bench_spec import run, table
        from .errors import VkspecError
        if args.rounds < 1:
            raise VkspecError(f"--rounds must be at least 1, got {args.rounds}")
        rows = run(args.model, backends=args.backends.split(","), modes=args.modes.split(","), n=args.n,
                   dtype=args.dtype, prompts=args.prompts.split(","), out_dir=args.out, rounds=args.rounds,
                   activations=args.activations, mtp_file=args.mtp_file)
        if args.json:
            print(json.dumps([{k: v for k, v in r.items() if k != "text"} for r in rows]))
        else:
            print(table(rows, args.model, args.n))
            print(f"\n(written: {args.out}/bench.md, bench.json, bench.png)", file=sys.stderr)
        return 0 if all(r.get("identical") in (True, None) for r in rows) else 1
    from .loader import Loader, open_checkpoint
    cfg, ckpt = open_checkpoint(args.model, args.dtype)
    per_token = bench.weight_bytes_per_token(Loader(cfg, ckpt, args.dtype).load(False), cfg)
    model = load_model(args.model, fmt=args.dtype, activations=args.activations, backend=args.backend,
                       device_gb=args.device_gb, mtp_file=args.mtp_file)
    out = bench.run(model, reps=args.reps)
    out.update(dtype=args.dtype, activations=args.activations, weight_bytes_per_token=per_token,
               file_bytes=ckpt.file_bytes())
    if args.json:
        print(json.dumps(out))
    else:
        held = "the file's own formats" if args.model.endswith(".gguf") else args.dtype
        print(f"{args.backend}, weights in {held}: decode {out['decode_tok_s']:.1f} tok/s, "
              f"host share {out['host_share']:.1%}, weights read per token "
              f"{out['weight_bytes_per_token'] / 2**20:.1f} MiB (file {out['file_bytes'] / 2**20:.1f} MiB)")
        print("n          " + " ".join(f"{n:>6}" for n in out["t_ratio"]))
        print("T(n)/T(1)  " + " ".join(f"{v:6.2f}" for v in out["t_ratio"].values()))
    return 0


def _plan(args) -> int:
    from .plan import plan, table
    from .tier.resident import TierConfig
    tier = TierConfig(budget_gb=args.budget_gb) if args.budget_gb is not None else None
    d = plan(args.model, fmt=args.dtype, ctx=args.ctx, tier=tier, snapshots=args.snapshots,
             drafts=args.drafts, activations=args.activations, mtp_file=args.mtp_file)
    print(json.dumps(d) if args.json else table(d))
    return 0


def _serve(args) -> int:
    import uvicorn
    from .serve.app import create_app
    from .serve.engine import Engine
    from .serve.text import chat_template
    from .speculative.sources import build, listed_size, save_vocab
    from .tokenizer import find_tokenizer
    from .errors import VkspecError
    if not args.max_body_mb > 0 or not args.state_budget_mb >= 0:
        raise VkspecError("--max-body-mb must be above 0 and --state-budget-mb at least 0")
    cfg = spec_config(args)
    tier = tier_config(args, args.model)
    sock = _listen(args.host, args.port)          # a port in use fails now, not after the load
    model = load_for_spec(args, cfg, tier)
    if model.backend != "cpu":      # the first requests should not wait for pipeline builds
        t0 = time.perf_counter()
        spec = cfg.spec_mode != "off"
        model.warm(copies=cfg.spec_mtp_recurrent_snapshots if spec else 0,
                   listed=listed_size(model, cfg) if spec else 0)
        print(f"[vkspec serve] decoding shapes recorded in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
    tok = find_tokenizer(args.model)
    sources, gate = build(model, cfg, args.model)
    engine = Engine(model, tok, sources, gate, snapshots=cfg.spec_mtp_recurrent_snapshots,
                    eos=set(model.cfg.eos_token_id), budget_bytes=int(args.state_budget_mb * (1 << 20)),
                    fallback=fallback_for(args, model))
    name = Path(args.model).name
    import os
    from .serve.guard import is_loopback
    key = args.api_key if args.api_key is not None else os.environ.get("VKSPEC_API_KEY") or None
    if not key and not is_loopback(args.host):
        print(f"[vkspec serve] warning: listening on {args.host} without an API key: anyone who can reach "
              "this port can use the model (set --api-key or VKSPEC_API_KEY)", file=sys.stderr, flush=True)
    app = create_app(engine, tok, name, chat_template(args.model), api_key=key,
                     max_body=int(args.max_body_mb * (1 << 20)), bind_host=args.host, allow_hosts=args.allow_host)
    port = sock.getsockname()[1]
    host = f"[{args.host}]" if ":" in args.host else args.host

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:          # the socket accepts: say so, and where
                print(f"[vkspec serve] ready: {name} on http://{host}:{port} ({model.backend}, {args.dtype}, "
                      f"{args.activations} activations, spec {cfg.spec_mode})", file=sys.stderr, flush=True)
    import signal

    def on_term(signum, frame):     # uvicorn shuts down, then re-raises the signal to this handler
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, on_term)
    try:
        # on a signal, open turns get 5 s; then their tasks are cancelled, which
        # cancels the turns at their next round
        Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)).run(sockets=[sock])
    except SystemExit:
        pass
    finally:
        save_vocab(sources)
        if getattr(model, "tier", None) is not None and args.tier_history_out:
            model.tier.save_history(args.tier_history_out)
        print("[vkspec serve] stopped; counts saved", file=sys.stderr, flush=True)
    return 0


def _listen(host: str, port: int):
    """A bound socket for the server (uvicorn serves it): a port in use is one
    line, and --port 0 gets a free one that the ready line names."""
    import socket
    from .errors import VkspecError
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        raise VkspecError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def _make_tiny(args) -> int:
    from .tiny import make_tiny
    out = make_tiny(Path(args.dir), seed=args.seed, mtp=args.mtp, experts=args.experts, echo=args.echo,
                    hidden=args.hidden, layers=args.layers, vocab=args.vocab)
    print(f"wrote {out}")
    return 0


def _parents() -> dict[str, argparse.ArgumentParser]:
    """Flag groups that several commands share, declared once."""
    def parser():
        return argparse.ArgumentParser(add_help=False)

    model = parser()
    model.add_argument("model", help="a checkpoint directory or a .gguf file")
    model.add_argument("--mtp-file", default=None,
                       help="an MTP-only GGUF (convert_hf_to_gguf.py --mtp) for a .gguf model; "
                            "default: mtp-*.gguf beside it")
    model.add_argument("--dtype", choices=["f32", "int8", "int4-g64"], default="f32",
                       help="quantise a safetensors checkpoint's matrices while loading")
    model.add_argument("--activations", choices=["f32", "q8"], default="q8",
                       help="the arithmetic of block-quantised weights: q8 (int8 activation blocks, integer "
                            "dots; the default) or f32 (each weight widened, float dots; the reference); float "
                            "weights always take f32")
    model.add_argument("--device-gb", type=float, default=None,
                       help="device memory budget for the dense chain (default: unlimited; VKSPEC_DEVICE_GB)")
    backend = parser()
    backend.add_argument("--backend", choices=["cpu", "vulkan"], default="cpu")
    backend.add_argument("--ctx", type=int, default=None,
                         help="context length (default: run sizes it to the prompt and -n; otherwise the "
                              "model's, at most 4096)")
    backend.add_argument("--fallback", choices=["cpu"], default=None,
                         help="when the device fails (at start-up or mid-run), continue on the CPU with the "
                              "same bits (default: stop with the output so far)")
    spec = parser()
    spec.add_argument("--spec", choices=["off", "lookup", "mtp", "auto", *UNSUPPORTED_SPEC], default=None,
                      help="draft source (spec_mode; default auto: prompt lookup, and the MTP head where the "
                           "checkpoint has one, each drafting only when the gate finds it pays; off: none)")
    spec.add_argument("--drafts", type=int, default=None, help="spec_draft_max K (1..7, default 7)")
    spec.add_argument("--snapshots", type=int, default=None,
                      help="spec_mtp_recurrent_snapshots S (0..7, default 7)")
    spec.add_argument("--mtp-vocab", type=int, default=None,
                      help="spec_mtp_fr_vocab_size: most-used ids the MTP head scores (0: all; 16000)")
    spec.add_argument("--no-gate", action="store_true", help="draft every proposal in full (tests)")
    spec.add_argument("--pstep", action="store_true", help="per-step confidence for the MTP head's drafts")
    spec.add_argument("--config", default=None, help="a TOML file with spec_* keys (flags override it)")
    tier = parser()
    tier.add_argument("--tier-gb", type=float, default=None,
                      help="expert tier: device memory for routed experts (default: all on the device)")
    tier.add_argument("--tier-rate", type=int, default=2, help="expert uploads per forward at most")
    tier.add_argument("--tier-no-balance", action="store_true", help="the same slots for every layer")
    tier.add_argument("--tier-stream", action="store_true",
                      help="stream missing experts through the device instead of the CPU")
    tier.add_argument("--tier-history", nargs="?", const="", default=None,
                      help="start from this usage history and save it at the end (without a path: "
                           "the user's cache, first started from expert_usage.json beside the model)")
    return dict(model=model, backend=backend, spec=spec, tier=tier)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vkspec", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = _parents()
    p = sub.add_parser("selftest", help="every shader on the device against its NumPy twin, one op at a time, byte for byte")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("make-tiny", help="write a deterministic tiny checkpoint")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mtp", action="store_true")
    p.add_argument("--echo", action="store_true",
                   help="weights whose greedy output walks 8-token cycles (repetitive text for drafts)")
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)

    p = sub.add_parser("run", help="generate", parents=[g["model"], g["backend"], g["spec"], g["tier"]])
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt")
    prompt.add_argument("--prompt-ids")
    p.add_argument("-n", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-eos", action="store_true")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server",
                       parents=[g["model"], g["backend"], g["spec"], g["tier"]])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--api-key", default=None,
                   help="require Authorization: Bearer KEY (default: VKSPEC_API_KEY; none on loopback)")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="largest request body (413 above it)")
    p.add_argument("--state-budget-mb", type=float, default=1024.0,
                   help="bytes for pins and saved turn states together (least recently used go first)")
    p.add_argument("--allow-host", action="append", default=[],
                   help="another name this server answers to in Host (repeatable; default: loopback "
                        "names and --host)")

    p = sub.add_parser("doctor", help="what this machine gives vkspec: device, driver, float controls, "
                                      "probes, CPU kernels, where things live")
    p.add_argument("model", nargs="?", default=None, help="a model, to name where its counts live")

    p = sub.add_parser("plan", help="the memory plan", parents=[g["model"]])
    p.add_argument("--budget-gb", type=float, default=None, help="the expert tier's budget")
    p.add_argument("--snapshots", type=int, default=7)
    p.add_argument("--drafts", type=int, default=7)
    p.add_argument("--ctx", type=int, default=None)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("bench", help="the speculative benchmark (a table and a PNG), or --verify-cost",
                       parents=[g["model"]])
    p.add_argument("--verify-cost", action="store_true",
                   help="T(n)/T(1) of verify blocks, host share and decode tok/s of one backend")
    p.add_argument("--backend", choices=["cpu", "vulkan"], default="vulkan")
    p.add_argument("--backends", default="cpu,vulkan")
    p.add_argument("--modes", default="off,lookup,mtp,auto")
    p.add_argument("--prompts", default="code-edit,chat")
    p.add_argument("-n", type=int, default=96)
    p.add_argument("--out", default="out/bench")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--rounds", type=int, default=1,
                   help="run the modes interleaved this many times; tok/s and TTFT are medians")
    p.add_argument("--json", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
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
        if args.cmd == "plan":
            return _plan(args)
        if args.cmd == "serve":
            return _serve(args)
        if args.cmd == "doctor":
            from .doctor import main as doctor
            return doctor(args.model)
    except VkspecError as e:                  # one clear line, no traceback (a DeviceError is one)
        print(f"vkspec: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
