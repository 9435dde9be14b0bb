"""GGUF files (llama.cpp's format) for the dense Llama family, read with the
PyPI ``gguf`` package.

* Weights: F32, F16, Q8_0 and Q4_1 tensors are dequantised at load by the
  ``gguf`` package itself (``gguf.quants.dequantize``), so the weights vkspec
  computes with equal that package's dequantisation bit for bit, and run as
  f32. A GGUF is never re-quantised into another format (``--dtype`` other
  than f32 is refused).
* llama.cpp stores attn_q/attn_k rows permuted for its interleaved RoPE; they
  are permuted back to Hugging Face's rotate-half order (a row permutation: no
  arithmetic).
* Config and tokenizer come from the metadata: the gpt2-style byte-level BPE
  (tokens, merges, control tokens) rebuilt with ``tokenizers``, and the chat
  template.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import VkspecError

SUPPORTED_TYPES = ("F32", "F16", "Q8_0", "Q4_1")


def is_gguf(path) -> bool:
    p = Path(path)
    return p.is_file() and p.suffix == ".gguf"


class GgufFile:
    def __init__(self, path):
        import gguf
        self.path = Path(path)
        self.dir = self.path
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except Exception as e:                       # the package raises ValueError and friends
            raise VkspecError(f"{self.path}: not a readable GGUF file ({str(e).splitlines()[0]})") from None
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = self.meta("general.architecture")
        if self.arch != "llama":
            raise VkspecError(f"{self.path}: architecture {self.arch!r} is not supported (llama)")

    def meta(self, key, default=None):
        f = self.reader.fields.get(key)
        if f is None:
            return default
        return f.contents()

    # --- config -----------------------------------------------------------------------
    def config_dict(self) -> dict:
        a = self.arch
        need = lambda k: self._need(f"{a}.{k}")  # noqa: E731
        heads = int(need("attention.head_count"))
        hidden = int(need("embedding_length"))
        vocab = self.meta(f"{a}.vocab_size") or len(self.meta("tokenizer.ggml.tokens") or [])
        eos = self.meta("tokenizer.ggml.eos_token_id")
        return {
            "model_type": "llama", "vocab_size": int(vocab), "hidden_size": hidden,
            "num_hidden_layers": int(need("block_count")), "num_attention_heads": heads,
            "num_key_value_heads": int(self.meta(f"{a}.attention.head_count_kv", heads)),
            "head_dim": int(self.meta(f"{a}.rope.dimension_count", hidden // heads)),
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
        if parts[:2] == ["model", "layers"]:
            i, rest = parts[2], ".".join(parts[3:])
            table = {"input_layernorm.weight": "attn_norm.weight",
                     "post_attention_layernorm.weight": "ffn_norm.weight",
                     "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
                     "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
                     "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                     "mlp.down_proj.weight": "ffn_down.weight"}
            if rest in table:
                return f"blk.{i}.{table[rest]}"
        return name

    def __contains__(self, name: str) -> bool:
        return self._gguf_name(name) in self.tensors

    def get(self, name: str, shape: tuple | None = None) -> np.ndarray:
        import gguf
        g = self._gguf_name(name)
        t = self.tensors.get(g)
        if t is None:
            raise VkspecError(f"{self.path}: missing tensor {g} ({name})")
        kind = t.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise VkspecError(f"{self.path}: tensor {g} is {kind}; supported: {', '.join(SUPPORTED_TYPES)}")
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        w = np.asarray(w, dtype=np.float32).reshape(tuple(int(x) for x in reversed(t.shape)))
        if len(w.shape) == 2 and w.shape[0] == 1 and shape is not None and len(shape) == 1:
            w = w[0]
        if shape is not None and tuple(w.shape) != tuple(shape):
            raise VkspecError(f"{self.path}: tensor {g} has shape {tuple(w.shape)}, expected {tuple(shape)}")
        if g.endswith(("attn_q.weight", "attn_k.weight")):
            a = self.arch
            heads = int(self.meta(f"{a}.attention.head_count"))
            if g.endswith("attn_k.weight"):
                heads = int(self.meta(f"{a}.attention.head_count_kv", heads))
            w = unpermute_rope_rows(w, heads)
        return np.ascontiguousarray(w)

    # --- tokenizer ----------------------------------------------------------------------
    def tokenizer(self):
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        if self.meta("tokenizer.ggml.model") != "gpt2":
            raise VkspecError(f"{self.path}: tokenizer model {self.meta('tokenizer.ggml.model')!r} "
                              "is not supported (gpt2 byte-level BPE)")
        tokens = self.meta("tokenizer.ggml.tokens")
        merges = [tuple(m.split(" ", 1)) for m in self.meta("tokenizer.ggml.merges")]
        types = self.meta("tokenizer.ggml.token_type") or [1] * len(tokens)
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


def unpermute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (pairs interleaved per head) back to rotate-half order."""
    rows = w.shape[0]
    half = rows // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
