"""Which draft sources and gate a spec_mode means."""

from __future__ import annotations

from pathlib import Path

from .config import SpecConfig
from .forced import ForcedDrafts
from .gate import Gate
from .lookup import PromptLookup
from .mtp import MtpDrafts
from .vocab import DraftVocab, counts_location


def build(model, cfg: SpecConfig, model_dir=None, forced: str | None = None,
          reference: list[int] | None = None, vocab_file: str | Path | None = None):
    """(sources, gate) for cfg.spec_mode; `forced` wraps every source (tests)."""
    mode = cfg.spec_mode
    sources = []
    if mode in ("lookup", "auto"):
        sources.append(PromptLookup(cfg.spec_lookup_max))
    if mode == "mtp" or (mode == "auto" and model.has_mtp):
        path, start = (Path(vocab_file), None) if vocab_file else \
            counts_location(model_dir) if model_dir else (None, None)
        vocab = DraftVocab(model.cfg.vocab_size, cfg.spec_mtp_fr_vocab_size, path, start)
        sources.append(MtpDrafts(model, vocab))
    if forced:
        sources = [ForcedDrafts(s, forced, reference or [], model.cfg.vocab_size) for s in sources]
    gate = Gate(min(cfg.spec_draft_max, model.max_rows - 1), enabled=cfg.spec_gate,
                pstep=cfg.spec_gate_pstep) if sources else None
    return sources, gate


def listed_size(model, cfg: SpecConfig) -> int:
    """About how many ids the MTP head will score (0: the whole vocabulary),
    for the device to record those shapes beforehand."""
    size, vocab = cfg.spec_mtp_fr_vocab_size, model.cfg.vocab_size
    head = cfg.spec_mode in ("mtp", "auto") and model.has_mtp
    return size if head and 0 < size < vocab else 0


def save_vocab(sources) -> None:
    for s in sources:
        v = getattr(getattr(s, "inner", s), "vocab", None)
        if v is not None:
            v.save()
