"""The MTP head in a file of its own: ``convert_hf_to_gguf.py --mtp`` writes
only the MTP block (``mtp-<name>.gguf``: the model's architecture and
block_count, the nextn tensors of layer num_hidden_layers, token_embd,
output, output_norm), for a model file converted with ``--no-mtp``.

vkspec reads it as the model's mtp.* tensors: given with ``--mtp-file FILE``,
or found beside a GGUF that carries no head of its own (``mtp-`` plus the
model's file name, else the folder's only ``mtp-*.gguf``). It must be the
same model: architecture, widths and trunk depth are compared, in one line
when they differ.
"""

from __future__ import annotations

from pathlib import Path

from .errors import VkspecError

_SAME = ("embedding_length", "attention.head_count", "attention.head_count_kv", "attention.key_length")


def beside(model_path) -> Path | None:
    """The MTP file that belongs to a GGUF model file, if there is one."""
    p = Path(model_path)
    named = p.with_name("mtp-" + p.name)
    if named.is_file():
        return named
    found = [q for q in sorted(p.parent.glob("mtp-*.gguf")) if q.resolve() != p.resolve()]
    if len(found) > 1:
        raise VkspecError(f"{p}: {len(found)} mtp-*.gguf files beside it ({', '.join(q.name for q in found)}); "
                          "name one with --mtp-file")
    return found[0] if found else None


class WithMtpFile:
    """A model checkpoint whose mtp.* names are answered by another GGUF."""

    def __init__(self, main, mtp):
        self.main, self.mtp = main, mtp
        if "mtp.fc.weight" not in mtp:
            raise VkspecError(f"{mtp.path}: not an MTP file (no nextn tensors; llama.cpp's convert_hf_to_gguf.py "
                              "--mtp writes one)")
        arch = getattr(main, "arch", None)
        if mtp.arch != arch:
            raise VkspecError(f"{mtp.path}: an MTP file of a {mtp.arch} model, not of this {arch} one")
        for k in _SAME:
            a, b = main.meta(f"{arch}.{k}"), mtp.meta(f"{arch}.{k}")
            if a != b:
                raise VkspecError(f"{mtp.path}: {arch}.{k} is {b}, the model's is {a}: not this model's MTP head")
        if mtp.n_trunk != main.n_trunk:
            raise VkspecError(f"{mtp.path}: its head follows {mtp.n_trunk} layers, the model has {main.n_trunk}")

    def _of(self, name: str):
        return self.mtp if name.startswith("mtp.") else self.main

    def __contains__(self, name: str) -> bool:
        return name in self._of(name)

    def get(self, name, shape=None):
        return self._of(name).get(name, shape)

    def matrix(self, name, shape):
        return self._of(name).matrix(name, shape)

    def map_pages(self) -> int:
        return self.main.map_pages() + self.mtp.map_pages()

    def drop_pages(self):
        self.main.drop_pages()
        self.mtp.drop_pages()

    def __getattr__(self, attr):
        return getattr(self.main, attr)
