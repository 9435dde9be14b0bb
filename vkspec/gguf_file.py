"""GGUF files (llama.cpp's format): metadata read once (vkspec.gguf_reader),
weights kept in their blocks.

* Weights: every 2-D tensor is a formats.matrix.QWeight over its bytes in the
  mapped file (F32, F16, BF16, Q4_0 ... Q6_K): never widened, never
  re-quantised. Vectors (norms) are read as float32.
* llama.cpp stores a llama model's attn_q/attn_k rows permuted for its
  interleaved RoPE; the matrix gets the row order back to Hugging Face's
  rotate-half order (QWeight.order: nothing moves).
* Config and tokenizer come from the same one read of the metadata: the
  gpt2-style byte-level BPE (tokens, merges, control tokens) rebuilt with
  ``tokenizers``, and the chat template.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import family_gemma3
from .errors import VkspecError
from .formats import ggml
from .formats.matrix import FORMATS, QWeight, dequantize, no_scales
from .gguf_reader import read_gguf

ARCHITECTURES = ("llama", family_gemma3.GGUF_ARCH)
_LAYER_NAMES = {"input_layernorm.weight": "attn_norm.weight",
                "post_attention_layernorm.weight": "ffn_norm.weight",
                "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
                "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
                "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                "mlp.down_proj.weight": "ffn_down.weight"}
_ARCH_LAYER_NAMES = {family_gemma3.GGUF_ARCH: family_gemma3.GGUF_LAYER_NAMES}


def is_gguf(path) -> bool:
    p = Path(path)
    return p.is_file() and p.suffix == ".gguf"


class GgufFile:
    def __init__(self, path):
        self.path = Path(path)
        self.dir = self.path
        self.g = read_gguf(self.path)
        self.tensors = self.g.tensors
        self.arch = self.meta("general.architecture")
        if self.arch not in ARCHITECTURES:
            raise VkspecError(f"{self.path}: architecture {self.arch!r} is not supported "
                              f"({', '.join(ARCHITECTURES)})")
        self.layer_names = _ARCH_LAYER_NAMES.get(self.arch, _LAYER_NAMES)

    def meta(self, key, default=None):
        return self.g.metadata.get(key, default)

    def file_bytes(self) -> int:
        return self.g.file_size

    # --- config -----------------------------------------------------------------------
    def config_dict(self) -> dict:
        a = self.arch
        if a == family_gemma3.GGUF_ARCH:
            return family_gemma3.gguf_config(self.meta, self.tensors, self.path)
        need = lambda k: self._need(f"{a}.{k}")  # noqa: E731
        heads = int(need("attention.head_count"))
        hidden = int(need("embedding_length"))
        tokens = self.meta("tokenizer.ggml.tokens")
        vocab = self.meta(f"{a}.vocab_size") or (len(tokens) if tokens is not None else 0)
        eos = self.meta("tokenizer.ggml.eos_token_id")
        return {
            "model_type": "llama", "vocab_size": int(vocab), "hidden_size": hidden,
            "num_hidden_layers": int(need("block_count")), "num_attention_heads": heads,
            "num_key_value_heads": int(self.meta(f"{a}.attention.head_count_kv", heads)),
            "head_dim": int(self.meta(f"{a}.rope.dimension_count", hidden // max(heads, 1))),
            "intermediate_size": int(need("feed_forward_length")),
            "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
            "rope_theta": float(self.meta(f"{a}.rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self.meta(f"{a}.context_length", 4096)),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "eos_token_id": [int(eos)] if eos is not None else [],
        }

    def _need(self, key):
        v = self.meta(key)
        if v is None:
            raise VkspecError(f"{self.path}: missing metadata key {key!r}")
        return v

    # --- tensors ------------------------------------------------------------------------
    def _gguf_name(self, name: str) -> str:
        if name == "model.embed_tokens.weight":
            return "token_embd.weight"
        if name == "model.norm.weight":
            return "output_norm.weight"
        if name == "lm_head.weight":
            return "output.weight"
        parts = name.split(".")
        if parts[:2] == ["model", "layers"] and ".".join(parts[3:]) in self.layer_names:
            return f"blk.{parts[2]}.{self.layer_names['.'.join(parts[3:])]}"
        return name

    def __contains__(self, name: str) -> bool:
        return self._gguf_name(name) in self.tensors

    def _info(self, name: str, shape):
        g = self._gguf_name(name)
        t = self.tensors.get(g)
        if t is None:
            raise VkspecError(f"{self.path}: missing tensor {g} ({name})")
        got = t.numpy_shape
        if len(got) == 2 and got[0] == 1 and shape is not None and len(shape) == 1:
            got = got[1:]
        if shape is not None and tuple(got) != tuple(shape):
            raise VkspecError(f"{self.path}: tensor {g} has shape {tuple(got)}, expected {tuple(shape)}")
        return g, t

    def matrix(self, name: str, shape: tuple) -> QWeight:
        """A 2-D weight in its own blocks, a view of the mapped file."""
        g, t = self._info(name, shape)
        fmt = t.ggml_type.name.lower()
        if fmt not in FORMATS:
            raise VkspecError(f"{self.path}: tensor {g} is {t.ggml_type.name}; supported: "
                              f"{', '.join(n.upper() for n in ggml.TYPES)}")
        rows, cols = shape
        if cols % 4:
            raise VkspecError(f"{self.path}: tensor {g} has {cols} columns; vkspec needs a multiple of 4")
        w = QWeight(fmt, rows, cols, self.g.tensor_bytes(g).reshape(rows, -1), no_scales())
        if self.arch == "llama" and g.endswith(("attn_q.weight", "attn_k.weight")):
            heads = int(self.meta(f"{self.arch}.attention.head_count"))
            if g.endswith("attn_k.weight"):
                heads = int(self.meta(f"{self.arch}.attention.head_count_kv", heads))
            w = w.reordered(unpermute_rope_order(rows, heads))
        return w

    def get(self, name: str, shape: tuple | None = None) -> np.ndarray:
        """A tensor as float32 (vectors and small parameters; weights: matrix())."""
        g, t = self._info(name, shape)
        fmt = t.ggml_type.name.lower()
        if fmt not in FORMATS:
            raise VkspecError(f"{self.path}: tensor {g} is {t.ggml_type.name}, not a supported type")
        elems = int(np.prod(t.shape))
        v = dequantize(QWeight(fmt, 1, elems, self.g.tensor_bytes(g).reshape(1, -1), no_scales()))
        return v.reshape(shape if shape is not None else t.numpy_shape)

    # --- tokenizer ----------------------------------------------------------------------
    def tokenizer(self):
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        if self.arch == family_gemma3.GGUF_ARCH and self.meta("tokenizer.ggml.model") == "llama":
            return family_gemma3.tokenizer(self.meta, self.path)
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
        if self.meta("tokenizer.ggml.pre") in ("smollm", "qwen2", "llama-bpe", "deepseek-llm"):
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
