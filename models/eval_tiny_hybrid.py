"""The trained tiny hybrid's MTP head on held-out code, through vkspec itself:
greedy, plain against MTP drafts at a fixed depth (the gate off) and under the
gate (fresh per prompt, and kept across prompts as a server keeps it), on
both backends; tokens per forward, acceptance, decode tok/s, and
whether the text equals plain decoding's. Each prompt runs every
configuration back to back, ``--passes`` times over the prompts (noise on a
shared 2-core machine hits neighbours alike).

    .venv/bin/python models/eval_tiny_hybrid.py [models/tiny-hybrid] [--depth 2] [-n 64] [--mtp-vocab N]

``--mtp-vocab N``: the head scores only the N most-used ids (and the
conversation's); the default, 16000, is the whole of this 4096-token vocabulary.
The counts that rank the ids are the training split's token frequencies,
scaled to the steady state of the counts' halving (a temporary counts file:
the model's own vocab_usage.bin is not read or written).
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.sampling import Sampler
from vkspec.speculative import SpecConfig, generate_spec
from vkspec.speculative.sources import build
from vkspec.speculative.vocab import HALVE_EVERY, write_counts
from vkspec.tokenizer import load_tokenizer


def prompts(model_dir, count: int, length: int = 48):
    """The start of each held-out standard-library file, up to `length` tokens."""
    names = json.loads((Path(model_dir) / "heldout_files.json").read_text())
    tok = load_tokenizer(model_dir)
    lib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for name in names:
        text = (lib / name).read_text(encoding="utf-8", errors="replace")
        body = text[text.find("\n\n") + 2:] if text.startswith(('"""', "#")) else text
        ids = tok.encode(body)[:length]
        if len(ids) == length:
            out.append(ids)
        if len(out) == count:
            break
    return out


def training_counts(model_dir, path: Path) -> Path:
    """The training split's token counts (train_tiny_hybrid's --corpus tree:
    every .py under the stdlib but site-packages and test suites, all but
    every 10th file), scaled to sum 2 x HALVE_EVERY, written to ``path``."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(f.relative_to(lib)) for f in lib.rglob("*.py")
                   if not {"site-packages", "test", "tests"} & set(f.relative_to(lib).parts[:-1]))
    tok = load_tokenizer(model_dir)
    counts = np.zeros(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"], np.float64)
    for i, name in enumerate(files):
        if i % 10:
            ids = tok.encode((lib / name).read_text(encoding="utf-8", errors="replace"))
            counts += np.bincount(ids, minlength=counts.size)[:counts.size]
    write_counts(path, (counts * (2 * HALVE_EVERY / counts.sum())).astype(np.float32), 0)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="models/tiny-hybrid")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--backends", default="cpu,vulkan")
    ap.add_argument("--mtp-vocab", type=int, default=SpecConfig.spec_mtp_fr_vocab_size)
    ap.add_argument("--passes", type=int, default=2, help="measured passes over the prompts, interleaved")
    a = ap.parse_args()
    v = dict(spec_mtp_fr_vocab_size=a.mtp_vocab)
    counts = training_counts(a.model, Path(tempfile.mkdtemp()) / "vocab_usage.bin")
    ps = prompts(a.model, a.prompts)
    for backend in a.backends.split(","):
        m = load_model(a.model, backend=backend)
        configs = {f"mtp depth {a.depth}": SpecConfig(spec_mode="mtp", spec_draft_max=a.depth, spec_gate=False, **v),
                   "mtp gate": SpecConfig(spec_mode="mtp", spec_draft_max=7, **v),
                   "mtp gate kept": SpecConfig(spec_mode="mtp", spec_draft_max=7, **v)}
        # "kept": one gate and draft source for all prompts, as `vkspec serve`
        # keeps them across requests (the gate's measurements carry over);
        # the others start fresh per prompt, as `vkspec run` does
        kept = build(m, configs["mtp gate kept"], vocab_file=counts)
        # a first pass, not measured: the device records a sequence for each
        # new (rows, context bucket) shape once per model, as a server would
        # have long before; timing it would time Lavapipe's pipeline builds
        for ids in ps:
            generate(m, ids, a.n)
            for cfg in configs.values():
                generate_spec(m, ids, a.n, Sampler(), *build(m, cfg, vocab_file=counts))
        rows = {"plain": [], **{label: [] for label in configs}}
        for ids in ps * a.passes:
            ref = generate(m, ids, a.n)
            rows["plain"].append((ref, True))
            for label, cfg in configs.items():
                src = kept if label.endswith("kept") else build(m, cfg, vocab_file=counts)
                r = generate_spec(m, ids, a.n, Sampler(), *src)
                rows[label].append((r, r.tokens == ref.tokens and r.digest == ref.digest))
        base = sum(len(r.tokens) for r, _ in rows["plain"]) / sum(r.decode_s for r, _ in rows["plain"])
        for label, rs in rows.items():
            toks = sum(len(r.tokens) for r, _ in rs)
            fwd = sum(r.forwards for r, _ in rs)
            dr = sum(r.drafted for r, _ in rs)
            ac = sum(r.accepted for r, _ in rs)
            tps = toks / sum(r.decode_s for r, _ in rs)
            same = all(ok for _, ok in rs)
            acc = f"{ac / dr:.1%} ({ac}/{dr})" if dr else "-"
            print(f"{backend:<7} {label:<14} tokens/forward {toks / fwd:5.2f}  acceptance {acc:<16} "
                  f"decode {tps:7.1f} tok/s  x plain {tps / base:5.2f}  same text: {'yes' if same else 'NO'}",
                  flush=True)


if __name__ == "__main__":
    main()
