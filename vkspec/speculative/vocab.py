"""The MTP head's draft vocabulary: which token ids a draft may be.

The list holds the ``size`` most-used ids (0: the whole vocabulary), every id
whose count is at least 3/4 of the last of those, and every token of the
conversation. Each prompt token and each picked token adds 1 to its count;
all counts halve every 1024 counted tokens. The list is rebuilt when a
request starts and at each halving; a picked token missing from it joins at
once. Output never depends on it: a verify checks every draft, so a missing
id can only turn an accepted draft into a rejected one.

Counts persist in the user's cache, keyed by the model's content hash
(vkspec/cachedir.py: ``~/.cache/vkspec/models/<key>/vocab_usage.bin``), never
in the model folder. A model may ship starting counts beside its weights
(the same format and name): a first run reads them, later runs read the
cache copy; the shipped file is never written. A folder that cannot be
written costs one warning line and this run's counts, nothing else. Format:
  8 bytes  b"VKSPECVU"   magic
  4 bytes  version (1), vocabulary size, tokens counted since the last halving
  4 bytes  x vocab       float32 counts
  4 bytes  CRC-32 of everything before
A file that cannot be read as counts, has counts for another vocabulary
size, or ends on a damaged record is never overwritten.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

from ..cachedir import model_cache_dir

MAGIC = b"VKSPECVU"
HALVE_EVERY = 1024
FILE_NAME = "vocab_usage.bin"


class VocabFileError(ValueError):
    pass


def read_counts(path: Path, vocab: int) -> tuple[np.ndarray, int]:
    data = path.read_bytes()
    head = 8 + 12
    if len(data) < head + 4 or data[:8] != MAGIC:
        raise VocabFileError(f"{path}: not a vkspec vocabulary-usage file")
    version, v, since = struct.unpack("<III", data[8:head])
    if version != 1:
        raise VocabFileError(f"{path}: unknown version {version}")
    if v != vocab:
        raise VocabFileError(f"{path}: counts for a vocabulary of {v}, the model has {vocab}")
    if len(data) != head + 4 * v + 4:
        raise VocabFileError(f"{path}: ends on a damaged record ({len(data)} bytes, want {head + 4 * v + 4})")
    (crc,) = struct.unpack("<I", data[-4:])
    if zlib.crc32(data[:-4]) != crc:
        raise VocabFileError(f"{path}: checksum mismatch (damaged record)")
    return np.frombuffer(data[head:-4], dtype="<f4").astype(np.float32), since


def write_counts(path: Path, counts: np.ndarray, since: int):
    body = MAGIC + struct.pack("<III", 1, counts.size, since) + counts.astype("<f4").tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        tmp.write_bytes(body + struct.pack("<I", zlib.crc32(body)))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def counts_location(model) -> tuple[Path | None, Path | None]:
    """(the cache file, read and written; the counts shipped beside the
    model, read only) for a model folder or file."""
    model = Path(model)
    cache = model_cache_dir(model)
    shipped = model / FILE_NAME if model.is_dir() else None
    return (cache / FILE_NAME if cache is not None else None), shipped


class DraftVocab:
    """The list and its counts. The head scores the listed ids only (the
    lm_head reads those rows alone, on both backends), so a draft costs less
    the shorter the list."""

    def __init__(self, vocab: int, size: int = 16000, path: Path | None = None, start: Path | None = None):
        """path: the counts file (read, and written by save); start: counts to
        begin from while path does not exist yet (read only)."""
        self.vocab, self.size, self.path = vocab, size, path
        self.counts = np.zeros(vocab, np.float32)
        self.since = 0
        self.writable = True
        self.conversation: set[int] = set()
        self.appended = self.rebuilds = self.picks = self.picks_inside = 0
        self.sizes: list[int] = []
        source = path if path is not None and path.exists() else start
        if source is not None and source.exists():
            try:
                self.counts, self.since = read_counts(source, vocab)
            except (OSError, VocabFileError) as e:
                self.writable = source != path or path is None    # never overwrite what we cannot read
                print(f"[vkspec vocab] {e}; starting from zero counts, the file is kept", file=sys.stderr)
        self.ids = np.arange(vocab)
        self.member = np.ones(vocab, bool)

    @property
    def whole(self) -> bool:
        return self.size == 0 or self.size >= self.vocab

    def rebuild(self):
        self.rebuilds += 1
        if self.whole:
            self.ids, self.member = np.arange(self.vocab), np.ones(self.vocab, bool)
        else:
            order = np.argsort(-self.counts, kind="stable")
            last = self.counts[order[self.size - 1]]
            member = np.zeros(self.vocab, bool)
            member[order[:self.size]] = True
            member |= self.counts >= np.float32(0.75) * last
            member[list(self.conversation)] = True
            self.member, self.ids = member, np.flatnonzero(member)
        self.sizes.append(int(self.ids.size))

    def begin(self, prompt, fed: int = 0):
        """A request: its tokens are the conversation; those past a reused
        prefix count."""
        self.conversation = set(int(t) for t in prompt)
        for t in prompt[fed:]:
            self._count(int(t))
        self.rebuild()

    def _count(self, tok: int) -> bool:
        self.counts[tok] += np.float32(1.0)
        self.since += 1
        if self.since >= HALVE_EVERY:
            self.counts *= np.float32(0.5)
            self.since = 0
            return True
        return False

    def picked(self, tok: int):
        self.picks += 1
        self.picks_inside += bool(self.member[tok])
        self.conversation.add(tok)
        if self._count(tok):
            self.rebuild()
        elif not self.member[tok]:
            self.member[tok] = True
            self.ids = np.flatnonzero(self.member)
            self.appended += 1

    @property
    def listed(self) -> np.ndarray | None:
        """The ids the head scores (None: the whole vocabulary). The array is
        replaced, never edited, when the list changes."""
        return None if self.whole or self.ids.size == self.vocab else self.ids

    def best(self, logits: np.ndarray, listed: bool = False) -> tuple[int, float]:
        """The listed id with the highest score (the lower id on a tie), and
        its probability under a softmax over the listed scores within 20 of it.
        ``listed``: the logits are the listed ids' scores only, in list order."""
        s = np.asarray(logits, np.float64)
        if not listed:
            s = s[self.ids]
        j = int(np.argmax(s))
        near = s[s >= s[j] - 20.0]
        return int(self.ids[j]), float(1.0 / np.exp(near - s[j]).sum())

    def save(self) -> bool:
        """Write the counts; a place that cannot be written gets one warning
        line (the run's output never depends on this file)."""
        if self.path is None or not self.writable:
            return False
        try:
            write_counts(self.path, self.counts, self.since)
        except OSError as e:
            print(f"[vkspec vocab] warning: the draft-vocabulary counts were not saved to {self.path} "
                  f"({e.strerror or e})", file=sys.stderr)
            return False
        return True

    def checkpoint(self):
        return (self.counts.copy(), self.since, set(self.conversation), self.member.copy(), self.ids)

    def restore(self, ck):
        counts, self.since, conv, member, self.ids = ck
        self.counts, self.conversation, self.member = counts.copy(), set(conv), member.copy()
