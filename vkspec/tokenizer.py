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


def load_tokenizer(model_dir) -> Tok:
    from .gguf_file import GgufFile, is_gguf
    if is_gguf(model_dir):
        return Tok(GgufFile(model_dir).tokenizer())
    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        raise VkspecError(f"{model_dir}: no tokenizer.json (use --prompt-ids)")
    from tokenizers import Tokenizer
    try:
        return Tok(Tokenizer.from_file(str(path)))
    except Exception as e:
        raise VkspecError(f"{path}: not a readable tokenizer ({str(e).splitlines()[0]})") from None
