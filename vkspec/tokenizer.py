"""Tokenizers: tokenizer.json through the `tokenizers` library."""

from __future__ import annotations

from pathlib import Path

from .errors import VkspecError


class Tok:
    """``bos``: the id every prompt starts with (a GGUF's add_bos_token, as
    llama.cpp does; Gemma needs its <bos>), added once: a text that already
    begins with it (a chat template that writes it) gets no second one."""

    def __init__(self, tk, bos: int | None = None):
        self.tk, self.bos = tk, bos

    def encode(self, text: str) -> list[int]:
        return self.with_bos(self.tk.encode(text, add_special_tokens=False).ids)

    def with_bos(self, ids) -> list[int]:
        ids = list(ids)
        return ids if self.bos is None or ids[:1] == [self.bos] else [self.bos] + ids

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
    from . import pages
    from .gguf_file import is_gguf, open_gguf
    if is_gguf(model_dir):
        f = open_gguf(model_dir)
        tok = Tok(f.tokenizer(), f.bos_to_add())
        f.let_go_vocabulary()
        pages.trim_heap()
        return tok
    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        raise VkspecError(f"{model_dir}: no tokenizer.json (use --prompt-ids)")
    from tokenizers import Tokenizer
    try:
        tk = Tokenizer.from_file(str(path))
    except Exception as e:
        raise VkspecError(f"{path}: not a readable tokenizer ({str(e).splitlines()[0]})") from None
    pages.trim_heap()
    return Tok(tk, _bos_of_config(Path(model_dir) / "tokenizer_config.json", tk))


def _bos_of_config(path: Path, tk) -> int | None:
    """tokenizer_config.json's bos_token when it says add_bos_token (Gemma's
    Hugging Face checkpoints do; the text is encoded without the tokenizer's
    own special tokens, so vkspec adds it, once)."""
    import json
    try:
        d = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError) as e:
        raise VkspecError(f"{path}: unreadable ({e})") from None
    bos = d.get("bos_token") if isinstance(d, dict) and d.get("add_bos_token") else None
    if isinstance(bos, dict):
        bos = bos.get("content")
    return tk.token_to_id(bos) if isinstance(bos, str) else None
