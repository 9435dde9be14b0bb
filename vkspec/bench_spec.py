"""`vkspec bench MODEL`: the speculative benchmark users read.

Runs plain decoding and each draft source (lookup, the MTP head when the model
has one, auto = both under the gate) on each backend, over a code-edit prompt
and a chat prompt, and reports per run: tokens per forward, acceptance
overall and by position, decode tok/s, time to first token, and whether the
text equals plain decoding's on that backend. Writes a markdown table and a
PNG plot; a progress bar runs on stderr.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

CODE = '''def summarize(orders):
    total = 0
    count = 0
    largest = None
    for order in orders:
        if order.get("cancelled"):
            continue
        amount = order["price"] * order["quantity"]
        total += amount
        count += 1
        if largest is None or amount > largest:
            largest = amount
    average = total / count if count else 0.0
    report = {
        "total": total,
        "count": count,
        "average": average,
        "largest": largest,
    }
    return report
'''
# (user message, the start of the answer): the code edit's answer is started
# for the model, as an editor integration does, so a small model copies the
# function instead of talking about it
PROMPTS = {
    "code-edit": ("Rename the variable total to revenue in this function and print the whole function "
                  "again.\n\n```python\n" + CODE + "```",
                  "```python\ndef summarize(orders):\n    revenue = 0\n    count"),
    "chat": ("What are three simple tips for staying focused while studying? Answer briefly.", ""),
}


def encode_prompt(model_dir, prompt) -> list[int]:
    """The prompt as the model's chat template frames it (plain text without
    one), followed by the start of the answer."""
    from .gguf_file import is_gguf, open_gguf
    from .serve.text import chat_template, render_chat
    from .tokenizer import load_tokenizer
    user, answer = prompt
    tok = load_tokenizer(model_dir)
    template = open_gguf(model_dir).chat_template() if is_gguf(model_dir) else chat_template(model_dir)
    text = render_chat(template, [{"role": "user", "content": user}]) if template else user + "\n"
    return tok.encode(text) + (tok.encode(answer) if answer else [])


def run(model_dir, backends=("cpu", "vulkan"), modes=("off", "lookup", "mtp", "auto"), n: int = 96,
        dtype: str = "f32", prompts=("code-edit", "chat"), out_dir=None, progress=True,
        rounds: int = 1, activations: str = "q8", mtp_file=None) -> list[dict]:
    """One row per (backend, prompt, mode). With rounds > 1 the modes run
    interleaved that many times and tok/s, TTFT and tokens per forward are
    medians (the gate's choices, so the counters, depend on measured time);
    "x plain" is the median of the rounds' own ratios."""
    from tqdm import tqdm

    from .loader import load_model
    from .sampling import Sampler
    from .speculative import SpecConfig, generate_spec
    from .speculative.sources import build, listed_size
    from .tokenizer import load_tokenizer
    tok = load_tokenizer(model_dir)
    rows = []
    bar = tqdm(total=len(backends) * len(prompts) * len(modes) * rounds, desc="vkspec bench", unit="run",
               disable=not progress)
    for backend in backends:
        model = load_model(model_dir, fmt=dtype, backend=backend, activations=activations, mtp_file=mtp_file)
        # every shape the runs will meet, recorded now
        model.warm(max(len(encode_prompt(model_dir, PROMPTS[p])) for p in prompts) + n + 8,
                   copies=SpecConfig().spec_mtp_recurrent_snapshots,
                   listed=listed_size(model, SpecConfig(spec_mode="mtp")))
        for pname in prompts:
            ids = encode_prompt(model_dir, PROMPTS[pname])
            runs = {m: [] for m in modes if m != "mtp" or model.has_mtp}
            for rnd in range(rounds):
                for mode in (list(runs) if rnd % 2 == 0 else list(runs)[::-1]):
                    bar.set_postfix_str(f"{backend} {pname} {mode}")
                    cfg = SpecConfig(spec_mode=mode)
                    if rnd == 0:
                        generate_spec(model, ids[:8], 2, Sampler(), *build(model, cfg))      # record shapes
                    sources, gate = build(model, cfg)
                    t0 = time.perf_counter()
                    r = generate_spec(model, ids, n, Sampler(), sources, gate,
                                      stop=set(model.cfg.eos_token_id))
                    runs[mode].append((r, time.perf_counter() - t0))
                    bar.update()
            plain = runs.get("off", [(None, 0)])[0][0]
            for mode in modes:
                if mode not in runs:
                    rows.append(dict(backend=backend, prompt=pname, mode=mode, skipped="no MTP head"))
                    bar.update(rounds)
                    continue
                rows.append(_row(backend, pname, mode, runs[mode], runs.get("off"), plain, tok))
        del model
    bar.close()
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.md").write_text(table(rows, model_dir, n) + "\n")
        (out / "bench.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "text"}
                                                    for r in rows], indent=1) + "\n")
        plot(rows, out / "bench.png", Path(model_dir).name)
    return rows


def _row(backend, pname, mode, runs, plain_runs, plain, tok) -> dict:
    """A table row from one mode's rounds (and plain decoding's, side by side)."""
    med = statistics.median
    r, c = runs[0][0], runs[0][0].counters
    tok_s = med(x.decode_tok_s for x, _ in runs)
    base = med(x.decode_tok_s for x, _ in plain_runs) if plain_runs else None
    return dict(
        backend=backend, prompt=pname, mode=mode, rounds=len(runs), tokens=len(r.tokens), digest=r.digest,
        forwards=r.forwards,
        tokens_per_forward=med(len(x.tokens) / max(x.forwards, 1) for x, _ in runs), drafted=c.drafted,
        accepted=c.accepted, acceptance=c.accepted / c.drafted if c.drafted else None,
        by_position=[t / k for k, t in zip(c.carried, c.taken) if k],
        decode_tok_s=tok_s, ttft_s=med(x.prefill_s for x, _ in runs), wall_s=med(w for _, w in runs),
        identical=None if plain is None else all(x.tokens == plain.tokens and x.digest == plain.digest
                                                 for x, _ in runs),
        # the median of each round's ratio to plain decoding in that round: the
        # two ran minutes apart at most, so a drift of the machine cancels
        speedup=None if base is None else med(x.decode_tok_s / p.decode_tok_s
                                              for (x, _), (p, _) in zip(runs, plain_runs)),
        text=tok.decode(r.tokens))


def table(rows, model_dir, n) -> str:
    head = (f"vkspec bench: {Path(model_dir).name}, {n} tokens, greedy\n\n"
            "| backend | prompt | spec | tokens/forward | acceptance | by position | decode tok/s | "
            "x plain | TTFT s | same text |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['backend']} | {r['prompt']} | {r['mode']} | {r['skipped']} | | | | | | |")
            continue
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%} ({r['accepted']}/{r['drafted']})"
        pos = " ".join(f"{p:.0%}" for p in r["by_position"]) or "-"
        lines.append(f"| {r['backend']} | {r['prompt']} | {r['mode']} | {r['tokens_per_forward']:.2f} | {acc} | "
                     f"{pos} | {r['decode_tok_s']:.2f} | {_cell(r['speedup'])} | {r['ttft_s']:.2f} | "
                     f"{'-' if r['identical'] is None else 'yes' if r['identical'] else 'NO'} |")
    return "\n".join(lines)


def _cell(v) -> str:
    return "-" if v is None else f"{v:.2f}"     # no off row to compare with


def plot(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    done = [r for r in rows if "skipped" not in r]
    labels = [f"{r['backend']}\n{r['prompt']}\n{r['mode']}" for r in done]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(done) * 0.9), 7), sharex=True)
    axes[0].bar(range(len(done)), [r["decode_tok_s"] for r in done], color="tab:blue")
    axes[0].set_ylabel("decode tok/s")
    axes[0].set_title(f"vkspec bench: {title}")
    axes[1].bar(range(len(done)), [r["tokens_per_forward"] for r in done], color="tab:green")
    axes[1].set_ylabel("tokens per forward")
    axes[1].set_xticks(range(len(done)), labels, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
