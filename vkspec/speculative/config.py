"""Speculative-decoding settings: defaults, a TOML file, command-line flags.

Keys (TOML, top level or under [spec]; flags override the file):
  spec_mode                      off | lookup | mtp | auto (the default: prompt lookup, and the MTP
                                 head where the checkpoint has one, both under the gate) |
                                 draft-model | dflash | dspark
  spec_draft_max                 K, drafts per verify at most (1..7, default 7)
  spec_mtp_recurrent_snapshots   S, recurrent copy slots at most (0..7, default 7)
  spec_mtp_fr_vocab_size         N, the MTP draft vocabulary's most-used ids (0: all; 16000)
  spec_gate                      true: the gate picks the depth; false: every proposal in full
  spec_lookup_max                prompt-lookup drafts at most (1..7, default 7; the gate and K cap it too)
  spec_gate_pstep                true: the MTP head's own probabilities trim each step's
                                 drafts and stop deeper ones (per-step confidence; false)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import VkspecError

MODES = ("off", "lookup", "mtp", "auto", "draft-model", "dflash", "dspark")
UNSUPPORTED = ("draft-model", "dflash", "dspark")
MAX_DRAFTS = 7


@dataclass
class SpecConfig:
    spec_mode: str = "auto"          # drafts never change a token; the gate drafts only where it pays
    spec_draft_max: int = 7
    spec_mtp_recurrent_snapshots: int = 7
    spec_mtp_fr_vocab_size: int = 16000
    spec_gate: bool = True
    spec_lookup_max: int = 7
    spec_gate_pstep: bool = False

    def check(self, src: str = "settings") -> "SpecConfig":
        if self.spec_mode not in MODES:
            raise VkspecError(f"{src}: spec_mode {self.spec_mode!r} is not one of {', '.join(MODES)}")
        if self.spec_mode in UNSUPPORTED:
            raise VkspecError(f"spec_mode {self.spec_mode} is not available: no compatible draft artifact "
                              "or graph exists for it (vkspec never substitutes another algorithm)")
        for key, lo, hi in (("spec_draft_max", 1, MAX_DRAFTS), ("spec_mtp_recurrent_snapshots", 0, MAX_DRAFTS),
                            ("spec_lookup_max", 1, MAX_DRAFTS), ("spec_mtp_fr_vocab_size", 0, 1 << 30)):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise VkspecError(f"{src}: {key} = {v!r} is out of range ({lo}..{hi})")
        for key in ("spec_gate", "spec_gate_pstep"):
            if not isinstance(getattr(self, key), bool):
                raise VkspecError(f"{src}: {key} = {getattr(self, key)!r} is not true or false")
        return self

    @classmethod
    def load(cls, path: str | Path | None, **overrides) -> "SpecConfig":
        values = {}
        if path is not None:
            p = Path(path)
            try:
                data = tomllib.loads(p.read_text())
            except (OSError, UnicodeDecodeError) as e:
                raise VkspecError(f"{p}: cannot read the config file ({e})") from None
            except tomllib.TOMLDecodeError as e:
                raise VkspecError(f"{p}: not valid TOML ({e})") from None
            data = data.get("spec", data)
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(data) - known)
            if unknown:
                raise VkspecError(f"{p}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
            values.update(data)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values).check(str(path) if path else "settings")
