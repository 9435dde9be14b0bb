"""Tokenizers: tokenizer.json through the `tokenizers` library."""

from __future__ import annotations

from pathlib import Path

from .errors import VkspecError


class Tok:
    def __init__(self, tk):
        self.tk = tk

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=False)


def find_tokenizer(model_dir) -> Tok | None:
    """The model's tokenizer, or None when it has none (a checkpoint without
    tokenizer.json runs on token ids). A tokenizer that is there but cannot
    be read is an error, never quietly None."""
    from .gguf_file import is_gguf
    if not is_gguf(model_dir) and not (Path(model_dir) / "tokenizer.json").exists():
        return None
    return load_tokenizer(model_dir)


def load_tokenizer(model_dir) -> Tok:
    from .gguf_file import is_gguf, open_gguf
    if is_gguf(model_dir):
        return Tok(open_gguf(model_dir).tokenizer())
    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        raise VkspecError(f"{model_dir}: no tokenizer.json (use --prompt-ids)")
    from tokenizers import Tokenizer
    try:
        return Tok(Tokenizer.from_file(str(path)))
    except Exception as e:
        raise VkspecError(f"{path}: not a readable tokenizer ({str(e).splitlines()[0]})") from None
