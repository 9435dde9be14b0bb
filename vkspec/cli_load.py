"""What `vkspec run`, `serve` and `bench` load from their flags: the spec
settings, the model (with its MTP head, and the CPU when the device cannot be
used), the CPU fallback for a device that fails mid-run, and the expert tier."""

from __future__ import annotations

import sys


def spec_config(args):
    """The spec_* settings of run and serve: the TOML file, then the flags."""
    from .speculative import SpecConfig
    return SpecConfig.load(args.config, spec_mode=args.spec, spec_draft_max=args.drafts,
                           spec_mtp_recurrent_snapshots=args.snapshots,
                           spec_mtp_fr_vocab_size=args.mtp_vocab,
                           spec_gate=False if args.no_gate else None,
                           spec_gate_pstep=True if args.pstep else None)


MTP_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")


def load_for_spec(args, cfg, tier):
    """The model, with its MTP head when the mode drafts from it (mtp requires
    one, auto takes it when the checkpoint has one). With --fallback cpu, a
    device that cannot be used (none, a failed probe, an allocation that
    failed) gives the CPU model instead, with one line on stderr."""
    from .errors import DeviceError
    from .loader import load_model
    mtp = {"mtp": True, "auto": None}.get(cfg.spec_mode, False)
    try:
        model = load_model(args.model, fmt=args.dtype, activations=args.activations, backend=args.backend,
                           device_gb=args.device_gb,
                           mtp=mtp, tier=tier, ctx=args.ctx, mtp_file=args.mtp_file)
    except DeviceError as e:
        if args.fallback != "cpu" or args.backend == "cpu":
            raise
        print(f"vkspec: {e}; running on the CPU (--fallback cpu)", file=sys.stderr, flush=True)
        args.fell_back = "load"
        model = load_model(args.model, fmt=args.dtype, activations=args.activations, backend="cpu", mtp=mtp,
                           ctx=args.ctx, mtp_file=args.mtp_file)
    if cfg.spec_mode == "auto" and not model.has_mtp and model.cfg.model_type in MTP_FAMILIES:
        # a family whose releases carry the head: a file converted without it should say so
        print(f"vkspec: {args.model}: no MTP head (no nextn tensors, no mtp-*.gguf beside it, no --mtp-file); "
              "drafting from prompt lookup only", file=sys.stderr, flush=True)
    return model


def fallback_for(args, model):
    """--fallback cpu: the CPU model a failed device hands over to, loaded
    from the same checkpoint at the first failure (speculative/fallback.py)."""
    if args.fallback != "cpu" or model.backend == "cpu":
        return None
    from .loader import load_model
    from .speculative.fallback import Fallback
    return Fallback(lambda: load_model(args.model, fmt=args.dtype, activations=args.activations, backend="cpu",
                                       mtp=model.has_mtp,
                                       ctx=model.ctx, mtp_file=args.mtp_file))


def tier_config(args, model_dir):
    """--tier-* flags -> a TierConfig (or None: every expert on the device)."""
    if args.tier_gb is None:
        return None
    from .tier.history import default_paths
    from .tier.resident import TierConfig
    hist = args.tier_history
    args.tier_history_out = hist               # saved at the end (None: not saved)
    if hist == "":                             # the cache copy, started from the model's own
        hist, args.tier_history_out = default_paths(model_dir)
    return TierConfig(budget_gb=args.tier_gb, rate=args.tier_rate, balance=not args.tier_no_balance,
                      stream=args.tier_stream, history=hist)
