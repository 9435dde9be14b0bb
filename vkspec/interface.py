"""What a model offers the decoder and the server, whichever backend runs it.

Terms:
* **row**: one token fed at one position. A **block** is n consecutive rows
  fed by one :meth:`Model.forward` (a decode step is a block of 1, a verify
  a block of k + 1, prefill goes in blocks of ``max_rows``). Every row of a
  block gets the bits it would get fed alone.
* **state**: everything a forward reads and writes besides the weights: the
  attention KV rows (valid up to ``kv_len``, the **watermark**), the
  recurrent state of every Gated DeltaNet layer (conv ring and delta-rule
  state), and the MTP head's own KV rows. One backend's state lives where
  it computes (host arrays, or device buffers).
* **copy slot**: the recurrent state after one row of a block, kept so that
  :meth:`Model.rewind` can undo the rows after it (recurrent state cannot be
  rewound by arithmetic). The state before a block is always kept.
* **snapshot**: a host copy of a state (:class:`HostState`), to restore later
  (a server's prefix reuse and pins).
* **listed ids**: the MTP head's draft vocabulary; the head's lm_head then
  scores only those rows (the same bits as in the whole row).

Both backends implement :class:`Model`; ``tests/test_structure.py`` checks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from .config import ModelConfig


@dataclass
class HostState:
    """A state as host arrays: the CPU backend's live state, and every
    backend's snapshot. ``block`` is the CPU backend's record of the last
    block, for :meth:`Model.rewind` (a snapshot has none)."""
    kv_k: list                      # per attention layer: (rows, nkv, hd)
    kv_v: list
    conv: list                      # per DeltaNet layer: (K-1, conv_dim) ring, oldest first
    ssm: list                       # per DeltaNet layer: (nv, dk, dv)
    kv_len: int = 0
    mtp_k: np.ndarray | None = None
    mtp_v: np.ndarray | None = None
    block: tuple | None = None
    before: tuple | None = None     # the CPU backend's state before a block (keep_before)
    slot_buffers: dict = field(default_factory=dict)     # the states after a block's rows, per DeltaNet layer

    def recurrent_copy(self):
        return [c.copy() for c in self.conv], [s.copy() for s in self.ssm]

    def keep_before(self):
        """The recurrent state before a block, kept without a copy: the live
        arrays become the kept ones and the live state moves to the other pair
        of buffers, which the block's forward writes from the kept arrays (a
        copy per block cost a DeltaNet layer's megabytes of traffic per token).
        Until that forward has run, the live arrays hold nothing valid."""
        if self.before is None:
            self.before = ([np.empty_like(c) for c in self.conv], [np.empty_like(s) for s in self.ssm])
        self.before, (self.conv, self.ssm) = (self.conv, self.ssm), self.before
        return self.before

    def set_recurrent(self, copy):
        conv, ssm = copy
        for dst, src in zip(self.conv, conv):
            dst[...] = src
        for dst, src in zip(self.ssm, ssm):
            dst[...] = src

    def kept_buffer(self, layer: int, rows: int):
        """Room for DeltaNet layer ``layer``'s state after each of ``rows``
        rows of a block (None for none), kept from block to block for the
        same reason as :meth:`keep_before`: as large as the most rows asked."""
        if rows == 0:
            return None
        buf = self.slot_buffers.get(layer)
        if buf is None or buf.shape[0] < rows:
            buf = self.slot_buffers[layer] = np.empty((rows,) + self.ssm[layer].shape, np.float32)
        return buf[:rows]

    def nbytes(self) -> int:
        arrays = self.kv_k + self.kv_v + self.conv + self.ssm + [a for a in (self.mtp_k, self.mtp_v)
                                                                 if a is not None]
        return int(sum(a.nbytes for a in arrays))


class State(Protocol):
    kv_len: int


@runtime_checkable
class Model(Protocol):
    """A model on one backend (vkspec.backends.cpu.model.CpuModel, the
    definition, or vkspec.backends.vulkan.model.VulkanModel)."""

    cfg: ModelConfig
    ctx: int                         # positions a state holds
    max_rows: int                    # rows a block may have
    backend: str                     # "cpu" | "vulkan"
    recordings: int                  # device sequences recorded so far (a forward that records is slow)
    listed_step: int                 # a draft vocabulary's length is rounded up to a multiple of this

    @property
    def has_mtp(self) -> bool:
        """The model was loaded with its MTP head."""

    def new_state(self) -> State:
        """An empty state (kv_len 0, recurrent state zero)."""

    def forward(self, tokens, st: State, logits_rows: str = "all",
                copies: int | bool = 0) -> tuple[np.ndarray, np.ndarray]:
        """Feed a block of n tokens at positions kv_len..kv_len+n-1.

        Returns (hidden (n, H): the last layer's output before the final norm,
        which the MTP head reads; logits (n, V), or (1, V) for the last row
        with logits_rows="last"). ``copies`` rows (True: all but the last)
        keep the recurrent state after them in copy slots."""

    def mtp_forward(self, hidden, next_tokens, st: State, positions, logits_rows: str = "all",
                    ids=None) -> tuple[np.ndarray, np.ndarray]:
        """The MTP head: one row per (h_t, token t+1) pair, written to the head's
        KV at ``positions``. Returns (head hidden, logits). logits_rows="last":
        the rows before the last only write their KV row and the last row's
        (1, H), (1, V) come back. ``ids``: the listed ids (ascending); logits
        then has one column per id."""

    def rewind(self, st: State, keep: int) -> None:
        """Keep rows 0..keep-1 of the last block (0: none): the watermark comes
        down and the recurrent state after row keep-1 (its copy slot) comes back."""

    def snapshot(self, st: State) -> HostState:
        """A host copy of the state, for :meth:`restore`."""

    def restore(self, st: State, snap: HostState) -> None:
        """Make ``state`` hold a snapshot's contents."""

    def warm(self, length: int = 0, copies: int = 0, listed: int = 0, prompt: int = 0) -> None:
        """Prepare everything a run will meet, so that no later forward pays
        for it: a prompt of ``prompt`` tokens, then decoding up to ``length``
        tokens with ``copies`` copy slots and a draft vocabulary of about
        ``listed`` ids (a device records its sequences; the CPU compiles or
        loads its kernels)."""
