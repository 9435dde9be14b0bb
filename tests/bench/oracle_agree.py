"""How long greedy decoding follows transformers (float32, on the GGUF's
dequantised weights): vkspec in f32 and q8 activations, and llama.cpp's CPU
backend (which quantises activations the way q8 does), on the same prompts.

    python tests/bench/oracle_agree.py MODEL.gguf [-n 32] [--peer DIR]

Prints, per prompt, the number of leading generated tokens equal to
transformers'. llama.cpp's output is text: it is tokenised again with the
model's tokenizer (llama-completion prints no ids), so its count can be one
short where a token boundary moves. llama.cpp drops the last newline of a
prompt file (the file gets one more) and adds its own <bos> (Gemma's is
taken off the text).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def leading(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> int:
    import torch
    import transformers

    from vkspec.bench_spec import PROMPTS, encode_prompt
    from vkspec.loader import load_model
    from vkspec.speculative import generate
    from vkspec.tokenizer import load_tokenizer
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--peer", default=os.environ.get("LLAMA_BIN", str(Path.home() / ".cache/vkspec-peer/build-cpu/bin")))
    a = ap.parse_args()
    path = Path(a.model).resolve()
    tok = load_tokenizer(path)
    prompts = {"code-edit": encode_prompt(path, PROMPTS["code-edit"]), "chat": encode_prompt(path, PROMPTS["chat"]),
               "code": tok.encode("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n")}
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    models = {acts: load_model(path, activations=acts, ctx=1024) for acts in ("f32", "q8")}
    print(f"{path.name}, greedy, {a.n} tokens: leading tokens equal to transformers'\n")
    print("| prompt | vkspec f32 | vkspec q8 | llama.cpp cpu |\n| --- | --- | --- | --- |")
    for name, ids in prompts.items():
        with torch.no_grad():
            want = hf.generate(torch.tensor([ids]), max_new_tokens=a.n, do_sample=False)[0, len(ids):].tolist()
        got = {acts: generate(m, ids, a.n).tokens for acts, m in models.items()}
        peer = "-"
        exe = Path(a.peer) / "llama-completion"
        if exe.exists():
            pf = Path(tempfile.mkdtemp()) / "prompt.txt"
            text = tok.decode(ids)
            text = text[len("<bos>"):] if text.startswith("<bos>") else text    # llama.cpp adds its own
            pf.write_text(text + "\n")                  # and drops a prompt file's last newline
            r = subprocess.run([exe, "-m", path, "-f", pf, "-n", str(a.n), "--temp", "0", "-t", "2", "--no-escape",
                                "-no-cnv", "--no-display-prompt", "--simple-io"], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL)
            lead = tok.encode("")                        # what the tokenizer puts first (Gemma's <bos>)
            out = tok.encode(r.stdout)
            out = out[len(lead):] if out[:len(lead)] == lead else out
            peer = str(leading(out, want)) if r.returncode == 0 else "failed"
        print(f"| {name} ({len(ids)} tokens) | {leading(got['f32'], want)} | {leading(got['q8'], want)} | {peer} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
