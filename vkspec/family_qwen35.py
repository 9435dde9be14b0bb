"""Qwen3.5 / Qwen3.6 GGUF files (llama.cpp's architectures ``qwen35`` and
``qwen35moe``): what llama.cpp's converter (conversion/qwen.py,
Qwen3_5TextModel / Qwen3_5MoeTextModel) does to a Hugging Face qwen3_5 /
qwen3_5_moe checkpoint, and how vkspec reads it back to the same bits.

Everything qwen3next does (norms stored 1 + w except ssm_norm, ssm_a =
-exp(A_log), the MTP block as layer ``num_hidden_layers`` with ``nextn.*``
tensors, block_count counting it), and on top:

* in_proj_a / in_proj_b become ssm_alpha / ssm_beta (no grouped ssm_ba);
* when the key heads are fewer than the value heads, every value-head axis is
  reordered from grouped (value head j of key head g at g*r + j) to tiled
  (j*nk + g), so that ggml can broadcast the key heads with a plain repeat:
  the v rows of attn_qkv, attn_gate's rows, ssm_alpha's and ssm_beta's rows,
  ssm_a, ssm_dt.bias, the v channels of ssm_conv1d, and ssm_out's columns.
  vkspec reads them back in grouped order: rows through QWeight.order
  (nothing moves), vectors by indexing, ssm_out's columns by gathering whole
  blocks of each row (no value is re-encoded), so that an F32 file runs to
  the bytes of its safetensors. Where ssm_out's blocks span value heads (the
  K-quants' 256 columns at head size 128) its columns cannot move: the file
  is then read as stored and the forward maps value head j to key head
  j % nk (ModelConfig.linear_v_tiled), on both backends;
* rope.dimension_sections (interleaved MRoPE): a text-only prompt gives every
  section the same position, which is plain RoPE, so it is read and ignored;
* ``convert_hf_to_gguf.py --mtp`` writes the MTP block alone (``mtp-*.gguf``:
  the same architecture and block_count, token_embd, output, output_norm and
  the blk.L tensors), read beside the model file (vkspec.mtp_file).

A file that says something vkspec does not read (a metadata key under the
architecture it does not know, a tensor it would never load: llama.cpp's
fused ffn_gate_up_exps, say) is refused in one line rather than run wrong.
"""

from __future__ import annotations

import re

import numpy as np

from .errors import VkspecError
from .gguf_keys import needer

ARCHS = {"qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text"}

# Hugging Face name (layer-relative) -> GGUF name, beyond qwen3next's
GGUF_LAYER_NAMES = {"linear_attn.in_proj_a.weight": "ssm_alpha.weight",
                    "linear_attn.in_proj_b.weight": "ssm_beta.weight"}

# the {arch}.* keys the converter writes (Qwen3_5(Moe)TextModel.set_gguf_parameters)
KNOWN_KEYS = frozenset("""
block_count context_length embedding_length feed_forward_length vocab_size
attention.head_count attention.head_count_kv attention.key_length attention.value_length
attention.layer_norm_rms_epsilon attention.recurrent_layers full_attention_interval
rope.freq_base rope.dimension_count rope.dimension_sections rope.scaling.type
expert_count expert_used_count expert_feed_forward_length expert_shared_feed_forward_length
nextn_predict_layers ssm.conv_kernel ssm.state_size ssm.group_count ssm.time_step_rank ssm.inner_size
""".split())

_TOP = frozenset(("token_embd.weight", "output_norm.weight", "output.weight"))
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


def check(arch: str, meta_keys, tensors, layer_names, path, blocks: int) -> None:
    """Every {arch}.* key and every tensor is one vkspec reads."""
    for k in meta_keys:
        if k.startswith(arch + ".") and k[len(arch) + 1:] not in KNOWN_KEYS:
            raise VkspecError(f"{path}: unknown key {k!r} in a {arch} file (vkspec does not know what it changes)")
    known = set(layer_names) | {f"ffn_{p}_exps.weight" for p in ("gate", "up", "down")} | \
        {f"nextn.{n}.weight" for n in ("eh_proj", "enorm", "hnorm", "shared_head_norm")}
    for name in tensors:
        m = _BLOCK.fullmatch(name)
        if name in _TOP or (m and int(m.group(1)) < blocks and m.group(2) in known):
            continue
        raise VkspecError(f"{path}: unknown tensor {name!r} in a {arch} file (vkspec would not read it)")


def grouped_order(nk: int, nv: int, d: int) -> np.ndarray:
    """Logical (grouped) index i of a value-head axis of nv heads of d is
    stored at order[i] (tiled)."""
    return np.arange(nv * d).reshape(nv // nk, nk, d).transpose(1, 0, 2).reshape(-1)


class Untile:
    """Where each tiled tensor of one file keeps its value heads."""

    def __init__(self, meta, arch: str, path):
        need = lambda k: int(needer(meta, arch, path)(k))  # noqa: E731
        self.nk, self.nv = need("ssm.group_count"), need("ssm.time_step_rank")
        self.dv = need("ssm.inner_size") // self.nv
        self.qk = 2 * self.nk * need("ssm.state_size")

    def _v(self, d):
        return grouped_order(self.nk, self.nv, d)

    def rows(self, g: str) -> np.ndarray | None:
        """The row order (stored row of logical row i) of a matrix or of a
        vector's elements (a conv weight's channels); None: as stored."""
        if g.endswith(("attn_qkv.weight", "ssm_conv1d.weight")):
            return np.concatenate([np.arange(self.qk), self.qk + self._v(self.dv)])
        if g.endswith("attn_gate.weight"):          # only the DeltaNet layers have one
            return self._v(self.dv)
        if g.endswith(("ssm_alpha.weight", "ssm_beta.weight", "ssm_a", "ssm_dt.bias")):
            return self._v(1)
        return None

    def columns(self, g: str) -> np.ndarray | None:
        return self._v(self.dv) if g.endswith("ssm_out.weight") else None

    def movable(self, block_elems: int) -> bool:
        """Whether ssm_out's columns can come back in a format of blocks of
        block_elems; where they cannot, the file is read as stored and the
        forward takes the value heads in tiled order (linear_v_tiled)."""
        return movable(self._v(self.dv), block_elems)


def movable(order: np.ndarray, block_elems: int) -> bool:
    """Whether a column order moves whole blocks of block_elems columns."""
    if order.size % block_elems:
        return False
    blocks = order.reshape(-1, block_elems)
    return not (np.any(blocks[:, 0] % block_elems) or np.any(blocks - blocks[:, :1] != np.arange(block_elems)))


def gather_columns(data: np.ndarray, block_elems: int, block_bytes: int, order: np.ndarray, path, g) -> np.ndarray:
    """The rows of ``data`` with their columns read in ``order``, moving whole
    blocks (a copy; the bytes of each block unchanged)."""
    if not movable(order, block_elems):
        raise VkspecError(f"{path}: tensor {g} stores value heads across its blocks of {block_elems} columns; "
                          "vkspec cannot read them back in order without re-encoding")
    blocks = order.reshape(-1, block_elems)
    rows = data.shape[0]
    return np.ascontiguousarray(data.reshape(rows, -1, block_bytes)[:, blocks[:, 0] // block_elems]).reshape(rows, -1)
