"""Where vkspec keeps what it learns about a model between runs (draft-
vocabulary counts, expert-usage history): the user's cache folder, never the
model folder, which may be read-only, shared, or a tracked checkout.

    $XDG_CACHE_HOME/vkspec/models/<key>/     (XDG_CACHE_HOME: ~/.cache when unset)

<key> is the first 16 hex digits of a cheap content hash of the model, so a
copy of a model anywhere shares one folder and a changed model gets a new
one. SHA-256 over, in order:
  * config.json's bytes (a folder model);
  * for each weight file (``*.safetensors``, ``*.gguf``; the model path itself
    when it is one file), sorted by name: its name, its size, its header
    (safetensors: the 8-byte length and the JSON header; GGUF: the first
    1 MiB) and the first and last 64 KiB after the header (fine-tunes of one
    architecture have equal headers and sizes, not equal weights).
Reading that is a few hundred KiB at most, whatever the model's size. A
collision would only share speed hints: none of these files changes output.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

SAMPLE = 64 << 10
GGUF_HEAD = 1 << 20


def cache_root() -> Path:
    x = os.environ.get("XDG_CACHE_HOME")
    base = Path(x) if x and os.path.isabs(x) else Path.home() / ".cache"
    return base / "vkspec"


def _weight_files(model: Path) -> list[Path]:
    if model.is_file():
        return [model]
    return sorted(p for p in model.iterdir() if p.suffix in (".safetensors", ".gguf") and p.is_file())


def _hash_file(h, path: Path):
    size = path.stat().st_size
    h.update(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as f:
        first = f.read(8)
        if path.suffix == ".safetensors" and len(first) == 8:
            (n,) = struct.unpack("<Q", first)
            head = 8 + min(n, size - 8)
        else:
            head = min(GGUF_HEAD, size)
        f.seek(0)
        h.update(f.read(head))
        h.update(f.read(SAMPLE))
        f.seek(max(head, size - SAMPLE))
        h.update(f.read(SAMPLE))


def model_key(model) -> str:
    """The model's content hash (see the module's docstring), 16 hex digits."""
    model = Path(model)
    h = hashlib.sha256(b"vkspec-model-key-1\0")
    config = model / "config.json"
    if model.is_dir() and config.is_file():
        h.update(config.read_bytes())
    for p in _weight_files(model):
        _hash_file(h, p)
    return h.hexdigest()[:16]


def model_cache_dir(model) -> Path | None:
    """The model's folder in the user's cache (not created here); None when
    the model path cannot be read."""
    try:
        return cache_root() / "models" / model_key(model)
    except OSError:
        return None
