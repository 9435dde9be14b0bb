"""GGUF files (llama.cpp's format): metadata read once (vkspec.gguf_reader),
weights kept in their blocks.

* Weights: every 2-D tensor is a formats.matrix.QWeight over its bytes in the
  mapped file (F32, F16, BF16, Q4_0 ... Q6_K): never widened, never
  re-quantised. Vectors (norms) are read as float32.
* Names: the loader asks for Hugging Face names; vkspec.families maps them to
  each architecture's GGUF names. A 3-D expert tensor (ffn_*_exps) answers
  for every expert: expert e is its rows [e*rows, (e+1)*rows), a view.
* llama.cpp stores a llama model's attn_q/attn_k rows permuted for its
  interleaved RoPE (llama only: qwen2/qwen3/qwen3moe/qwen3next use NEOX RoPE,
  rotate-half, as stored); the matrix gets the row order back to Hugging
  Face's rotate-half order (QWeight.order: nothing moves).
* Config and tokenizer come from the same one read of the metadata: the
  gpt2-style byte-level BPE (tokens, merges, control tokens) rebuilt with
  ``tokenizers``, and the chat template.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from . import families, family_qwen35
from .errors import VkspecError
from .formats import ggml
from .formats.matrix import FORMATS, QWeight, dequantize, no_scales
from .gguf_reader import read_gguf

ARCHITECTURES = tuple(families.GGUF_ARCHS)


def is_gguf(path) -> bool:
    p = Path(path)
    return p.is_file() and p.suffix == ".gguf"


_OPEN: dict = {}
_VOCABULARY = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
               "tokenizer.ggml.token_type")


def open_gguf(path) -> "GgufFile":
    """The file's metadata is read once per process: the model, its tokenizer
    and its chat template all come from this one GgufFile."""
    p = Path(path).resolve()
    st = p.stat()
    key = (p, st.st_size, st.st_mtime_ns)
    if key not in _OPEN:
        _OPEN[key] = GgufFile(p)
    return _OPEN[key]


class GgufFile:
    def __init__(self, path):
        self.path = Path(path)
        self.dir = self.path
        self.g = read_gguf(self.path)
        self.tensors = self.g.tensors
        self._let_go: set[str] = set()
        self._config: dict | None = None
        self.arch = self.meta("general.architecture")
        self.family = families.gguf_arch(self.arch, self.path)
        blocks = self.meta(f"{self.arch}.block_count")
        self.n_trunk = int(blocks or 0) - int(self.meta(f"{self.arch}.nextn_predict_layers", 0) or 0)
        self.untile, self.v_tiled = None, False
        if self.family.untile:
            family_qwen35.check(self.arch, list(self.g.metadata), self.tensors, self.family.layer.values(),
                                self.path, int(blocks or 0))
            self.untile = family_qwen35.Untile(self.meta, self.arch, self.path)
            self.v_tiled = not all(self.untile.movable(FORMATS[self._fmt(g, t)].block_elems)
                                   for g, t in self.tensors.items() if g.endswith("ssm_out.weight"))
            if self.v_tiled:
                self.untile = None

    def meta(self, key, default=None):
        if key in self._let_go:             # rare: read the header again
            return read_gguf(self.path).metadata.get(key, default)
        return self.g.metadata.get(key, default)

    def let_go_vocabulary(self):
        """The token and merge arrays (Gemma 3: 262k strings, ~28 MB of
        Python objects) are needed only to build the tokenizer: once it is
        built the process lets them go, and a later ask reads them again.
        The config, which counts the tokens, is made first."""
        try:
            self.config_dict()
        except VkspecError:
            return                          # its error comes where a config is asked for
        for key in _VOCABULARY:
            if self.g.metadata.pop(key, None) is not None:
                self._let_go.add(key)

    def file_bytes(self) -> int:
        return self.g.file_size

    def map_pages(self) -> int:
        """The CPU backend's weights, which are views into the file, made
        resident at load, in 2 MB pages where the system can
        (pages.map_in_huge); the bytes mapped in 2 MB pages."""
        from .pages import map_in_huge
        return map_in_huge(self.g._map, self.path, self.g.file_size)

    def huge_pages(self) -> int:
        """The bytes of the file this process maps in 2 MB pages."""
        from .pages import pmd_mapped
        return pmd_mapped(self.g._map)

    def drop_pages(self):
        """Let the process's mapped pages of the file go (they stay in the OS's
        page cache; a later read maps them again): after a device upload the
        weights live on the device only."""
        import mmap
        self.g._map.madvise(mmap.MADV_DONTNEED)

    # --- config -----------------------------------------------------------------------
    def config_dict(self) -> dict:
        """Made once per process (a copy each time: callers may edit theirs)."""
        if self._config is None:
            self._config = families.gguf_config(self.family, self.arch, self.meta, self.tensors, self.path)
            if self.v_tiled:
                self._config["vkspec"]["linear_v_tiled"] = True
        return copy.deepcopy(self._config)

    # --- tensors ------------------------------------------------------------------------
    def _where(self, name: str) -> tuple[str, int | None]:
        return families.gguf_name(self.family, name, self.n_trunk)

    def __contains__(self, name: str) -> bool:
        g, expert = self._where(name)
        t = self.tensors.get(g)
        return t is not None and (expert is None or (len(t.shape) == 3 and expert < t.numpy_shape[0]))

    def _info(self, name: str, shape):
        """(GGUF name, tensor, expert). Size-1 axes are not compared: a
        (C, 1, K) conv weight is stored (C, K), a (1, H) gate may be (H)."""
        g, expert = self._where(name)
        t = self.tensors.get(g)
        if t is None:
            raise VkspecError(f"{self.path}: missing tensor {g} ({name})")
        got = t.numpy_shape
        if expert is not None:
            if len(got) != 3 or expert >= got[0]:
                raise VkspecError(f"{self.path}: tensor {g} has shape {tuple(got)}, no expert {expert}")
            got = got[1:]
        if shape is not None and tuple(got) != tuple(shape) and \
                tuple(d for d in got if d != 1) != tuple(d for d in shape if d != 1):
            raise VkspecError(f"{self.path}: tensor {g} has shape {tuple(got)}, expected {tuple(shape)}")
        return g, t, expert

    def _fmt(self, g, t) -> str:
        fmt = t.ggml_type.name.lower()
        if fmt not in FORMATS:
            raise VkspecError(f"{self.path}: tensor {g} is {t.ggml_type.name}; supported: "
                              f"{', '.join(n.upper() for n in ggml.TYPES)}")
        return fmt

    def matrix(self, name: str, shape: tuple) -> QWeight:
        """A 2-D weight (or one expert of a 3-D one) in its own blocks, a view
        of the mapped file."""
        g, t, expert = self._info(name, shape)
        fmt = self._fmt(g, t)
        rows, cols = shape
        if cols % 4:
            raise VkspecError(f"{self.path}: tensor {g} has {cols} columns; vkspec needs a multiple of 4")
        stored = int(np.prod(t.numpy_shape[:-1]))
        w = QWeight(fmt, stored, cols, self.g.tensor_bytes(g).reshape(stored, -1), no_scales())
        if expert is not None:
            return w.rows_of(expert * rows, (expert + 1) * rows)
        if self.family.permute_qk and g.endswith(("attn_q.weight", "attn_k.weight")):
            heads = int(self.meta(f"{self.arch}.attention.head_count"))
            if g.endswith("attn_k.weight"):
                heads = int(self.meta(f"{self.arch}.attention.head_count_kv", heads))
            w = w.reordered(unpermute_rope_order(rows, heads))
        if self.untile is not None:
            return self._untiled(g, w)
        return w

    def _untiled(self, g, w: QWeight) -> QWeight:
        order, cols = self.untile.rows(g), self.untile.columns(g)
        if cols is not None:
            f = w.format
            w = QWeight(w.fmt, w.rows, w.cols, family_qwen35.gather_columns(
                w.data, f.block_elems, f.block_bytes, cols, self.path, g), w.scales)
        return w if order is None else w.reordered(order)

    def get(self, name: str, shape: tuple | None = None) -> np.ndarray:
        """A tensor as float32 (vectors and small parameters; weights: matrix())."""
        g, t, expert = self._info(name, shape)
        if expert is not None:
            raise VkspecError(f"{self.path}: tensor {g} is a matrix of experts, not a vector")
        fmt = self._fmt(g, t)
        elems = int(np.prod(t.shape))
        v = dequantize(QWeight(fmt, 1, elems, self.g.tensor_bytes(g).reshape(1, -1), no_scales()))
        order = self.untile.rows(g) if self.untile is not None else None
        if order is not None:               # the first axis holds the value heads (conv: its channels)
            v = v.reshape(t.numpy_shape)[order]
        return v.reshape(shape if shape is not None else t.numpy_shape)

    # --- tokenizer ----------------------------------------------------------------------
    def tokenizer(self):
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        if self.family.tokenizer is not None and self.meta("tokenizer.ggml.model") == "llama":
            return self.family.tokenizer(self.meta, self.path)
        if self.meta("tokenizer.ggml.model") != "gpt2":
            raise VkspecError(f"{self.path}: tokenizer model {self.meta('tokenizer.ggml.model')!r} "
                              "is not supported (gpt2 byte-level BPE)")
        tokens = list(self.meta("tokenizer.ggml.tokens"))
        merges = [tuple(m.split(" ", 1)) for m in self.meta("tokenizer.ggml.merges")]
        types = self.meta("tokenizer.ggml.token_type")
        types = [1] * len(tokens) if types is None else np.asarray(types).tolist()
        tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                  ignore_merges=False))
        pre = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if self.meta("tokenizer.ggml.pre") in ("smollm", "qwen2", "qwen35", "llama-bpe", "deepseek-llm"):
            pre.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tk.pre_tokenizer = pre_tokenizers.Sequence(pre)
        tk.decoder = decoders.ByteLevel()
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t, ty in zip(tokens, types) if ty == 3])
        return tk

    def chat_template(self) -> str | None:
        return self.meta("tokenizer.chat_template")

    def bos_to_add(self) -> int | None:
        """The id a prompt starts with when the file says add_bos_token (Gemma's <bos>)."""
        bos = self.meta("tokenizer.ggml.bos_token_id")
        return int(bos) if self.meta("tokenizer.ggml.add_bos_token") and bos is not None else None


def unpermute_rope_order(rows: int, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (pairs interleaved per head) back to
    rotate-half order: logical row i is stored row order[i]."""
    half = rows // heads // 2
    return np.arange(rows).reshape(heads, half, 2).swapaxes(1, 2).reshape(-1)


def unpermute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """The same, applied to an array of rows (the tests' reference)."""
    return w[unpermute_rope_order(w.shape[0], heads)]
