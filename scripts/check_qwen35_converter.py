"""Dev check (needs llama.cpp's source tree, which CI does not have): llama.cpp's
own convert_hf_to_gguf.py turns the tests' tiny qwen3_5 / qwen3_5_moe
checkpoints (tests/qwen35_models.py) into qwen35 / qwen35moe GGUF files, with
the MTP block, without it (--no-mtp) and alone (--mtp); each file must equal
the one tests/qwen35_models.py's write() makes (and so does a q8_0 conversion) with the gguf package (every tensor's
name, type, shape and bytes; every <arch>.* and tokenizer.ggml.* key), and vkspec must run the
converter's F32 files to the same bytes as the safetensors, and its q8_0 file
(value heads kept tiled) to the same ids and digest with MTP drafts as without.
Where llama.cpp's llama-completion is built, its greedy text of a converted
file must equal vkspec's (a checkpoint with dk == dv and 64 rope dims: what
llama.cpp's qwen35 graph assumes).

    PYTHONPATH=. python scripts/check_qwen35_converter.py [--llama-cpp DIR] [--keep DIR]

The converter refuses a tokenizer whose pre-tokenizer hash it does not list
(the tiny BPE's); the check answers "qwen2" for it and touches nothing else.
"""

import argparse
import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(HERE), str(HERE / "tests")]

CONVERT = """import runpy, sys
sys.path.insert(0, sys.argv.pop(1))
import conversion.base as b
b.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv[0] = sys.path[0] + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(llama, src, out, *flags, outtype="f32"):
    env = dict(os.environ, PYTHONPATH=str(Path(llama) / "gguf-py"))
    r = subprocess.run([sys.executable, "-c", CONVERT, str(llama), str(src), "--outtype", outtype,
                        "--outfile", str(out), *flags], env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"converter failed on {src} {flags}:\n{r.stderr[-3000:]}")
    if "--mtp" in flags:           # it names the file itself: mtp-<name>.gguf in the folder
        return next(Path(out).glob("mtp-*.gguf"))
    return Path(out)


# llama.cpp's qwen35 graph takes the value head size from ssm.state_size (dk) and
# needs rope dims >= 2 x the MRoPE sections' 32: a checkpoint it can run
LLAMA_RUNNABLE = dict(linear_value_head_dim=16, head_dim=64,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0})


def gpt2_bytes(tokens, ids) -> bytes:
    """The bytes of byte-level BPE tokens (GPT-2's byte <-> unicode table)."""
    bs = [*range(33, 127), *range(161, 173), *range(174, 256)]
    cs = bs[:] + [256 + n for n in range(256 - len(bs))]
    bs += [b for b in range(256) if b not in bs]
    u2b = {chr(c): b for b, c in zip(bs, cs)}
    return bytes(u2b[ch] for i in ids for ch in tokens[i])


def vs_llama_cpp(binary, path, prompt="hello world, the quick brown fox", n=16):
    """llama-completion's greedy text of a file against vkspec's (same prompt text)."""
    from vkspec.gguf_file import open_gguf
    from vkspec.loader import load_model
    from vkspec.speculative import generate
    r = subprocess.run([str(binary), "-m", str(path), "-p", prompt, "-n", str(n), "--temp", "0", "-no-cnv",
                        "--no-display-prompt", "-t", "1", "--no-warmup", "-c", "256"], capture_output=True,
                       env=dict(os.environ, LD_LIBRARY_PATH=str(Path(binary).parent)))
    f = open_gguf(path)
    ids = f.tokenizer().encode(prompt).ids
    mine = gpt2_bytes(f.meta("tokenizer.ggml.tokens"), generate(load_model(path), ids, n).tokens)
    theirs = r.stdout.removesuffix(b"\n\n")          # llama-completion ends its output so
    return r.returncode == 0 and mine == theirs, mine, theirs


def same_file(a, b):
    """Differences between two GGUF files: tensors and the architecture's keys."""
    import gguf
    ra, rb = gguf.GGUFReader(str(a)), gguf.GGUFReader(str(b))
    arch = ra.fields["general.architecture"].contents()
    keys = lambda r: {k: f.contents() for k, f in r.fields.items()  # noqa: E731
                      if k.startswith((arch + ".", "tokenizer.ggml.")) or k == "general.architecture"}
    bad = [f"key {k}: {v!r} != {keys(rb).get(k)!r}" for k, v in keys(ra).items() if keys(rb).get(k) != v]
    bad += [f"key {k} only in {b.name}" for k in keys(rb) if k not in keys(ra)]
    ta, tb = ({t.name: t for t in r.tensors} for r in (ra, rb))
    bad += [f"tensor {n} only in one file" for n in set(ta) ^ set(tb)]
    for n in set(ta) & set(tb):
        x, y = ta[n], tb[n]
        if (x.tensor_type, list(x.shape), x.data.tobytes()) != (y.tensor_type, list(y.shape), y.data.tobytes()):
            bad.append(f"tensor {n}: {x.tensor_type.name}{list(x.shape)} != {y.tensor_type.name}{list(y.shape)} "
                       "or its bytes differ")
    return bad


def main():
    ap = argparse.ArgumentParser()
    found = glob.glob(os.path.expanduser("~/.cache/vkspec-peer/*/vendor/llama.cpp"))
    ap.add_argument("--llama-cpp", default=found[0] if found else None)
    ap.add_argument("--keep", default=None, help="folder to keep the files in")
    ap.add_argument("--llama-completion", default=os.path.expanduser("~/.cache/vkspec-peer/build-cpu/bin/"
                                                                      "llama-completion"),
                    help="llama.cpp's binary, to compare greedy texts with (skipped when absent)")
    args = ap.parse_args()
    if not args.llama_cpp or not Path(args.llama_cpp, "convert_hf_to_gguf.py").is_file():
        sys.exit("no llama.cpp source tree (--llama-cpp DIR)")
    with tempfile.TemporaryDirectory() as tmp:
        return check(args, Path(args.keep or tmp))


def check(args, root):
    import qwen35_models as q
    from test_families_gguf import PROMPT, hybrid_run
    from test_families_qwen35_gguf import spec_run

    from vkspec.loader import load_model
    from vkspec.speculative import generate
    failed = 0
    for name in ("qwen3_5", "qwen3_5_moe"):
        src = q.checkpoint(name, root / name)
        conv = {"with": convert(args.llama_cpp, src, root / f"{name}-conv.gguf"),
                "none": convert(args.llama_cpp, src, root / f"{name}-conv-nomtp.gguf", "--no-mtp")}
        (root / f"{name}-mtp").mkdir(exist_ok=True)
        conv["only"] = convert(args.llama_cpp, src, root / f"{name}-mtp", "--mtp")
        conv["q8_0"] = convert(args.llama_cpp, src, root / f"{name}-conv-q8_0.gguf", outtype="q8_0")
        for mtp, path in conv.items():
            kw = dict(outtype="q8_0") if mtp == "q8_0" else dict(mtp=mtp)
            bad = same_file(path, q.write(src, root / f"{name}-lib-{mtp}.gguf", **kw))
            failed += bool(bad)
            print(f"{name} {mtp:>4}: converter file {'==' if not bad else '!='} gguf-package file", *bad[:8],
                  sep="\n  ")
        want = hybrid_run(load_model(src, mtp=True))
        runs = {"with MTP block": load_model(conv["with"]),
                "--no-mtp + mtp file": load_model(conv["none"], mtp_file=conv["only"])}
        for what, model in runs.items():
            ok = model.has_mtp and hybrid_run(model) == want
            failed += not ok
            print(f"{name}: vkspec run of the converter's file ({what}) {'==' if ok else '!='} safetensors run")
        model = load_model(conv["q8_0"])          # its own bytes: MTP drafts against plain decoding
        plain, drafted = generate(model, PROMPT[:9], 24), spec_run(model)
        ok = model.cfg.linear_v_tiled and (plain.tokens, plain.digest) == (drafted.tokens, drafted.digest)
        failed += not ok
        print(f"{name}: the converter's q8_0 file, tiled heads, MTP drafts {'==' if ok else '!='} plain decoding")
        if Path(args.llama_completion).is_file():
            src = q.checkpoint(name, root / f"{name}-llama", **LLAMA_RUNNABLE)
            ok, mine, theirs = vs_llama_cpp(args.llama_completion, convert(args.llama_cpp, src,
                                                                           root / f"{name}-llama.gguf"))
            failed += not ok
            print(f"{name}: greedy text of the converter's file, llama.cpp {'==' if ok else '!='} vkspec"
                  + ("" if ok else f": {theirs!r} / {mine!r}"))
    print("FAILED" if failed else "all equal", f"(files in {root})" if args.keep else "")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
