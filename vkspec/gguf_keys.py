"""A GGUF's metadata keys as the families read them (families.py,
family_gemma3.py): a missing key or an impossible attention shape is one line
naming the key."""

from __future__ import annotations

from .errors import VkspecError


def needer(meta, arch: str, path):
    """need(k): the value of "<arch>.<k>", or one line naming the missing key."""
    def need(k):
        v = meta(f"{arch}.{k}")
        if v is None:
            raise VkspecError(f"{path}: missing metadata key {arch}.{k!r}")
        return v
    return need


def attention_shape(meta, arch: str, path, head_dim_default: int | None = None) -> tuple[int, int, int]:
    """(heads, hidden, head_dim): key_length, else head_dim_default, else
    hidden / heads; a value_length other than key_length is refused."""
    need = needer(meta, arch, path)
    heads = int(need("attention.head_count"))
    if heads < 1:
        raise VkspecError(f"{path}: {arch}.attention.head_count = {heads} (must be >= 1)")
    hidden = int(need("embedding_length"))
    head_dim = int(meta(f"{arch}.attention.key_length") or head_dim_default or hidden // heads)
    vlen = meta(f"{arch}.attention.value_length")
    if vlen is not None and int(vlen) != head_dim:
        raise VkspecError(f"{path}: {arch}.attention.value_length {vlen} != key_length {head_dim} "
                          "(not supported)")
    return heads, hidden, head_dim
