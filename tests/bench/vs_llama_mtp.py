"""MTP drafting of vkspec next to llama.cpp's draft-mtp, on the same GGUF
(llama.cpp's converter writes the head as nextn tensors); each program's
speculative decode over its own plain decode, rounds interleaved.

    python tests/bench/vs_llama_mtp.py MODEL.gguf [--prompts heldout|code-edit] [--count 3]
                                       [-n 64] [--n-max 1,2,3] [--rounds 3] [--peer DIR]

For each prompt and each draft width k in --n-max:
* vkspec: `run --spec off`, then `--spec mtp --drafts k`; its MTP tokens
  must be its plain tokens (the run stops with an error otherwise);
* llama.cpp: `llama-completion` (plain), then `llama-speculative-simple
  --spec-type draft-mtp --spec-draft-n-max k`; whether its draft-mtp text
  equals its plain text (over the shorter of the two) is reported, not
  required: llama.cpp's kernels differ by batch size.

The table gives, per program, plain decode tok/s, the best k's decode tok/s
and their ratio (medians over rounds, then over prompts), and acceptance as
it comes. Prompts: "heldout" takes the starts of the bundled tiny hybrid's
held-out files (models/tiny-hybrid/heldout_files.json, what it was not
trained on); "code-edit" is `vkspec bench`'s code-edit prompt, rendered with
the file's chat template (a random-weight file).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_llama import ROOT, llama, machine, rendered_prompt, vkspec_run  # noqa: E402


def heldout(count: int) -> list[str]:
    sys.path.insert(0, str(ROOT / "models"))
    from eval_tiny_hybrid import prompts

    from vkspec.tokenizer import load_tokenizer
    model = ROOT / "models" / "tiny-hybrid"
    tok = load_tokenizer(model)
    return [tok.decode(ids) for ids in prompts(model, count)]


def same_text(a: str, b: str) -> bool:
    """Equal over the shorter (the speculative tool may stop a few tokens past
    -n), without the newlines both tools print after the text."""
    a, b = a.rstrip("\n"), b.rstrip("\n")
    k = min(len(a), len(b))
    return a[:k] == b[:k]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompts", choices=("heldout", "code-edit"), default="heldout")
    ap.add_argument("--count", type=int, default=3)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--n-max", default="1,2,3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peer", default=str(Path.home() / ".cache/vkspec-peer/build-cpu/bin"))
    a = ap.parse_args()
    widths = [int(k) for k in a.n_max.split(",")]
    texts = heldout(a.count) if a.prompts == "heldout" else [rendered_prompt(a.model)[0]]
    files = []
    for i, text in enumerate(texts):
        f = Path(tempfile.mkdtemp()) / f"prompt{i}.txt"
        f.write_text(text)
        files.append(f)
    plain_llama = ("-no-cnv", "--no-display-prompt", "--simple-io")
    runs: dict[tuple, list] = {}
    for rnd in range(a.rounds):
        for i, pf in enumerate(files):
            print(f"round {rnd + 1}/{a.rounds}, prompt {i + 1}/{len(files)}", file=sys.stderr, flush=True)
            plain = vkspec_run(a.model, pf, a.n, "cpu", "off", None)
            runs.setdefault((i, "vkspec", 0), []).append(plain)
            base = llama(a.peer, "llama-completion", a.model, pf, a.n, plain_llama)
            runs.setdefault((i, "llama.cpp", 0), []).append(base)
            for k in widths:
                got = vkspec_run(a.model, pf, a.n, "cpu", "mtp", None, extra=("--drafts", k))
                if got["tokens"] != plain["tokens"]:
                    sys.exit(f"vkspec's MTP tokens differ from its plain tokens (prompt {i}, k {k})")
                c = got["counters"]
                got["accept"] = c["accepted"] / max(c["drafted"], 1)
                runs.setdefault((i, "vkspec", k), []).append(got)
                spec = llama(a.peer, "llama-speculative-simple", a.model, pf, a.n,
                             ("--spec-type", "draft-mtp", "--spec-draft-n-max", str(k)))
                at = spec["text"].find(pf.read_text())            # it echoes the prompt (after blank lines)
                body = spec["text"][at + len(pf.read_text()):] if at >= 0 else spec["text"]
                spec["same"] = same_text(body, base["text"])
                runs.setdefault((i, "llama.cpp", k), []).append(spec)
    med = statistics.median
    print(f"{Path(a.model).name}: {len(files)} {a.prompts} prompts, -n {a.n}, {a.rounds} interleaved rounds; "
          f"medians over rounds, then over prompts; {machine()}; llama.cpp: its CPU backend, 2 threads\n")
    print("| program | k | decode tok/s | over its plain | acceptance | text equals its plain |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for who in ("vkspec", "llama.cpp"):
        plain = med(med(r["decode_tok_s"] for r in runs[(i, who, 0)]) for i in range(len(files)))
        print(f"| {who} | plain | {plain:.1f} | 1.00 | - | - |")
        for k in widths:
            rs = [runs[(i, who, k)] for i in range(len(files))]
            rate = med(med(r["decode_tok_s"] for r in per) for per in rs)
            acc = [r["accept"] for per in rs for r in per if r.get("accept") is not None]
            same = "yes" if who == "vkspec" else \
                f"{sum(r['same'] for per in rs for r in per)}/{sum(len(per) for per in rs)} runs"
            print(f"| {who} | {k} | {rate:.1f} | {rate / plain:.2f} | "
                  f"{med(acc):.2f} | {same} |" if acc else f"| {who} | {k} | {rate:.1f} | {rate / plain:.2f} | - | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
