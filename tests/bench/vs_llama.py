"""vkspec next to llama.cpp on the same machine, each program in its own
process, rounds interleaved; prints one table (markdown) and writes JSON.

    python tests/bench/vs_llama.py MODEL.gguf [--rounds 3] [-n 96] [--backends cpu,vulkan]
                                   [--activations f32,q8] [--no-lookup]
                                   [--peer DIR] [--peer-vulkan DIR] [--out out/vs_llama.json]
    python tests/bench/vs_llama.py A.gguf B.gguf ... [--rounds 3] [-n 32]

With several files (one model requantised to each format), each round runs
every file in turn, and the table has one row per file: prefill and plain
decode of vkspec's CPU path (q8) and llama.cpp's, no start or lookup runs.

--activations runs vkspec once per arithmetic (q8: int8 activation blocks
and integer dots), each as its own rows; --no-lookup leaves out the lookup
rows of both programs (real-width files, where a round is minutes).

The peer is llama.cpp 0c1e57098 (../shared/peer/build-llama-cpp.sh prints its
bin folder; --peer or $LLAMA_BIN). With --peer-vulkan (the bin folder that
tests/bench/build_llama_vulkan.sh prints), vkspec's vulkan rows are compared
with llama.cpp's Vulkan backend on the same Vulkan device (all layers on it,
GGML_VK_VISIBLE_DEVICES=0: the first device, Lavapipe where it is the only
one; it has no lookup row); without it, with llama.cpp's CPU backend. The
prompt is `vkspec bench`'s code edit, rendered with the model's chat
template, fed to both as the same text.

Rows (medians over the rounds):
Both programs run with a context of 4096 tokens (vkspec --ctx, llama.cpp -c),
so that their KV caches are the same size.

* start: wall time and peak RSS (/usr/bin/time %M) of a run that generates
  one token (vkspec run MODEL -n 1; llama-completion -n 1);
* prefill tok/s of the prompt, plain decode tok/s, prompt lookup decode tok/s
  (vkspec --spec lookup; the better of llama-lookup with 8 drafts and
  llama-speculative-simple's ngram-simple n=4 m=16), whole request wall time;
* vkspec's lookup text against its plain text (must be equal).

Both lookup tools of llama.cpp end at the end-of-turn token (91 of the 96
tokens on SmolLM2), llama-completion does not; so vkspec's lookup runs with
--stop-eos and its plain run without, and the lookup's tokens must be the
plain run's up to where the lookup stopped. Each decode rate is over the
tokens its own program decoded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vkspec.bench_spec import PROMPTS  # noqa: E402

CTX = 4096          # both programs' context length (peak RSS counts the KV cache)


def rendered_prompt(model) -> tuple[str, int]:
    """The code-edit prompt as text (chat template applied) and its token count."""
    from vkspec.gguf_file import GgufFile
    from vkspec.serve.text import render_chat
    from vkspec.tokenizer import load_tokenizer
    user, answer = PROMPTS["code-edit"]
    template = GgufFile(model).chat_template()
    text = (render_chat(template, [{"role": "user", "content": user}]) if template else user + "\n") + answer
    return text, len(load_tokenizer(model).encode(text))


def timed(cmd, env=None) -> tuple[float, int, str, str]:
    """(wall s, peak RSS bytes, stdout, stderr) of one process."""
    t0 = time.perf_counter()
    res = subprocess.run(["/usr/bin/time", "-f", "RSS %M"] + [str(c) for c in cmd], capture_output=True,
                         text=True, errors="replace", env=env, stdin=subprocess.DEVNULL)   # random weights: any bytes
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({res.returncode}): {res.stderr[-2000:]}")
    rss = int(re.findall(r"RSS (\d+)", res.stderr)[-1]) * 1024
    return wall, rss, res.stdout, res.stderr


def vkspec_run(model, prompt_file, n, backend, spec, env, stop_eos=False, activations="q8", ctx=CTX, extra=()):
    text = Path(prompt_file).read_text()
    wall, rss, out, _ = timed([sys.executable, "-m", "vkspec.cli", "run", model, "--prompt", text, "-n", n,
                               "--backend", backend, "--spec", spec, "--json", "--activations", activations,
                               "--ctx", ctx, *extra] + ["--stop-eos"] * stop_eos, env)
    d = json.loads(out)
    return dict(wall=wall, rss=rss, prefill_tok_s=d["prompt_tokens"] / max(d["prefill_s"], 1e-9),
                decode_tok_s=d["decode_tok_s"], tokens=d["tokens"], tpf=d["tokens_per_forward"], text=d["text"],
                counters=d.get("counters"))


_EVAL = re.compile(r"(prompt eval|eval) time =\s*([\d.]+) ms /\s*(\d+) (?:tokens|runs).*?([\d.]+) tokens per second")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")


def llama(bin_dir, tool, model, prompt_file, n, extra=(), env=None, ctx=CTX):
    cmd = [Path(bin_dir) / tool, "-m", model, "-f", prompt_file, "-n", n, "--temp", "0", "-t", "2",
           "-c", ctx, "--no-escape", *extra]
    for _ in range(3):               # llama-completion sometimes ends early with status 0 and no timings (qwen3next)
        wall, rss, out, err = timed(cmd, env)
        kinds = {kind for kind, *_ in _EVAL.findall(err)}
        if ("prompt eval" if int(n) == 1 else "eval") in kinds or _DECODED.search(err):
            break
    else:
        raise RuntimeError(f"{tool} printed no decode timings in 3 tries: {err[-800:]}")
    got = dict(wall=wall, rss=rss, text=out)
    for kind, _, _, rate in _EVAL.findall(err):
        got["prefill_tok_s" if kind == "prompt eval" else "decode_tok_s"] = float(rate)
    m = _DECODED.search(err)
    if m:                                     # llama-lookup / speculative report the whole generation
        got["decode_tok_s"] = float(m.group(3))
    m = _ACCEPT.search(err)
    if m:
        got["accept"] = float(m.group(1)) / 100
    return got


def runs_of(a) -> list[str]:
    """"backend activations" for every vkspec configuration of the run."""
    return [f"{b} {acts}" for b in a.backends.split(",") for acts in a.activations.split(",")]


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = open("/proc/cpuinfo").read()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    forced = os.environ.get("VKSPEC_CPU_ISA")
    return (f"{cpu} ({isa}{', vkspec forced to ' + forced if forced else ''}), {os.cpu_count()} cores, "
            f"Python {platform.python_version()}")


def per_file(a) -> int:
    """One row per file: prefill and plain decode, vkspec CPU q8 next to llama.cpp, rounds interleaved."""
    env, completion = dict(os.environ), ("-no-cnv", "--no-display-prompt", "--simple-io")
    runs: dict[tuple, list] = {}
    prompts = {}
    for model in a.model:
        text, n_prompt = rendered_prompt(model)
        pf = Path(tempfile.mkdtemp()) / "prompt.txt"
        pf.write_text(text)
        prompts[model] = (pf, n_prompt)
    for rnd in range(a.rounds):
        for model in a.model:
            print(f"round {rnd + 1}/{a.rounds}: {Path(model).name}", file=sys.stderr, flush=True)
            pf = prompts[model][0]
            runs.setdefault((model, "llama.cpp"), []).append(llama(a.peer, "llama-completion", model, pf, a.n, completion))
            runs.setdefault((model, "vkspec"), []).append(vkspec_run(model, pf, a.n, "cpu", "off", env))
    med = statistics.median
    print(f"{len(a.model)} files, {a.rounds} interleaved rounds, medians, -n {a.n}; {machine()}; "
          f"llama.cpp peer: its CPU backend, 2 threads\n")
    print("| file | prefill tok/s vkspec | llama.cpp | ratio | decode tok/s vkspec | llama.cpp | ratio |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    out = []
    for model in a.model:
        cells = []
        for field in ("prefill_tok_s", "decode_tok_s"):
            ours, theirs = (med(r[field] for r in runs[(model, who)]) for who in ("vkspec", "llama.cpp"))
            cells += [ours, theirs, ours / theirs]
        out.append((Path(model).name, cells))
        print(f"| {Path(model).name} ({prompts[model][1]} prompt tokens) | " + " | ".join(f"{v:.2f}" for v in cells) + " |")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"rows": out, "runs": {f"{Path(m).name} {who}": [
        {f: v for f, v in r.items() if f not in ("tokens", "text")} for r in rs] for (m, who), rs in runs.items()}}, indent=1) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--backends", default="cpu,vulkan")
    ap.add_argument("--peer", default=os.environ.get("LLAMA_BIN", str(Path.home() / ".cache/vkspec-peer/build-cpu/bin")),
                    help="llama.cpp's bin folder (docs/performance.md: a build without AMX where the "
                         "VM advertises AMX it cannot run)")
    ap.add_argument("--peer-vulkan", default=None,
                    help="llama.cpp's Vulkan build's bin folder (tests/bench/build_llama_vulkan.sh)")
    ap.add_argument("--activations", default="q8", help="vkspec's arithmetic(s), comma-separated: q8 (the default), f32")
    ap.add_argument("--no-lookup", action="store_true", help="plain decoding and prefill only")
    ap.add_argument("--out", default="out/vs_llama.json")
    a = ap.parse_args()
    if len(a.model) > 1:
        return per_file(a)
    a.model = a.model[0]
    text, n_prompt = rendered_prompt(a.model)
    pf = Path(tempfile.mkdtemp()) / "prompt.txt"
    pf.write_text(text)
    env = dict(os.environ)
    runs: dict[str, list] = {}

    def add(key, value):
        runs.setdefault(key, []).append(value)

    completion = ("-no-cnv", "--no-display-prompt", "--simple-io")
    for rnd in range(a.rounds):
        print(f"round {rnd + 1}/{a.rounds}", file=sys.stderr, flush=True)
        add("llama.cpp cpu start", llama(a.peer, "llama-completion", a.model, pf, 1, completion))
        add("llama.cpp cpu plain", llama(a.peer, "llama-completion", a.model, pf, a.n, completion))
        if not a.no_lookup:
            add("llama.cpp cpu lookup8", llama(a.peer, "llama-lookup", a.model, pf, a.n, ("--spec-draft-n-max", "8")))
            add("llama.cpp cpu ngram", llama(a.peer, "llama-speculative-simple", a.model, pf, a.n,
                                             ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
                                              "--spec-ngram-simple-size-m", "16")))
        if a.peer_vulkan and "vulkan" in a.backends.split(","):
            venv, gpu = dict(env, GGML_VK_VISIBLE_DEVICES="0"), completion + ("-ngl", "99")
            add("llama.cpp vulkan start", llama(a.peer_vulkan, "llama-completion", a.model, pf, 1, gpu, venv))
            add("llama.cpp vulkan plain", llama(a.peer_vulkan, "llama-completion", a.model, pf, a.n, gpu, venv))
        for backend in runs_of(a):
            b, acts = backend.split(" ")
            add(f"vkspec {backend} start", vkspec_run(a.model, pf, 1, b, "off", env, activations=acts))
            add(f"vkspec {backend} plain", vkspec_run(a.model, pf, a.n, b, "off", env, activations=acts))
            if not a.no_lookup:
                add(f"vkspec {backend} lookup", vkspec_run(a.model, pf, a.n, b, "lookup", env, stop_eos=True,
                                                           activations=acts))
    med = statistics.median

    def m(key, field):
        vals = [r[field] for r in runs.get(key, []) if field in r]
        return med(vals) if vals else None

    rows = []
    for backend in runs_of(a):
        same = all(lk["tokens"] == pl["tokens"][:len(lk["tokens"])] for lk, pl in zip(
            runs.get(f"vkspec {backend} lookup", []), runs[f"vkspec {backend} plain"]))
        peer = "vulkan" if backend.startswith("vulkan") and a.peer_vulkan else "cpu"
        best_lookup = max(m(f"llama.cpp {peer} lookup8", "decode_tok_s") or 0,
                          m(f"llama.cpp {peer} ngram", "decode_tok_s") or 0)
        rows += [
            (f"{backend}: start (-n 1) wall s", m(f"vkspec {backend} start", "wall"), m(f"llama.cpp {peer} start", "wall")),
            (f"{backend}: start (-n 1) peak RSS MB", m(f"vkspec {backend} start", "rss") / 1e6,
             m(f"llama.cpp {peer} start", "rss") / 1e6),
            (f"{backend}: prefill tok/s ({n_prompt} tokens)", m(f"vkspec {backend} plain", "prefill_tok_s"),
             m(f"llama.cpp {peer} plain", "prefill_tok_s")),
            (f"{backend}: plain decode tok/s", m(f"vkspec {backend} plain", "decode_tok_s"),
             m(f"llama.cpp {peer} plain", "decode_tok_s")),
        ] + ([] if a.no_lookup else [
            (f"{backend}: lookup decode tok/s (text same as plain: {'yes' if same else 'NO'})",
             m(f"vkspec {backend} lookup", "decode_tok_s"), best_lookup or None)]) + [
            (f"{backend}: whole request wall s (-n {a.n})", m(f"vkspec {backend} plain", "wall"),
             m(f"llama.cpp {peer} plain", "wall")),
        ]
    print(f"{Path(a.model).name}, {a.rounds} interleaved rounds, medians; {machine()}; llama.cpp peer: its CPU backend, 2 threads"
          + ("; vulkan rows: its Vulkan backend on the same device, all layers" if a.peer_vulkan else "") + "\n")
    print("| measure | vkspec | llama.cpp | ratio |\n| --- | --- | --- | --- |")
    for name, ours, theirs in rows:
        ratio = ours / theirs if ours and theirs else None
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"| {name} | {fmt(ours)} | {fmt(theirs)} | {fmt(ratio)} |")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"rows": rows, "runs": {k: [{f: v for f, v in r.items() if f not in ("tokens", "text")}
                                                                  for r in rs] for k, rs in runs.items()}},
                                      indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
