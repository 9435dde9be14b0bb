"""What a draft source offers the decoder (decode.py), and what it proposes.

A source sees the rows that stood (``observe``), proposes drafts after each
pick (``propose``), and can return to any earlier commit (``checkpoint`` /
``restore``): the decoder rolls a source back with the model when a round
fails or is cancelled. The sources: lookup.py (prompt lookup), mtp.py (the
checkpoint's MTP head); forced.py wraps either for the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass
class Proposal:
    """Drafts after the last pick, and (optionally) the source's own
    probability of each (the per-step confidence)."""
    source: str
    tokens: list[int]
    probs: list[float] | None = None
    seconds: float = 0.0          # time spent writing drafts past the first
    lead: float | None = None     # time spent writing the first draft (None: not measured)
    passes: int = 1               # the source's passes in that time
    extra: dict = field(default_factory=dict)
    kind: str = ""                # a class the gate measures apart ("copy" for lookup)

    @property
    def key(self) -> str:
        """The gate's name for this proposal's acceptance statistics."""
        return f"{self.source}/{self.kind}" if self.kind else self.source


@runtime_checkable
class DraftSource(Protocol):
    name: str                 # the gate keeps its statistics under this name
    free: bool                # proposing costs nothing: the gate may judge every proposal in hindsight

    def begin(self, model, state, prompt: list[int], fed: int = 0) -> None:
        """A request starts; with fed > 0 the state (and this source's own,
        restored by the caller) already holds the first fed prompt tokens."""

    def observe(self, tokens, hidden, start_pos: int) -> None:
        """Rows that stood in the model: tokens at start_pos.., their hidden states."""

    def prefilled(self) -> None:
        """The prompt is in (work a source does once per request goes here,
        inside the time to first token)."""

    def picked(self, tok: int) -> None:
        """A token was emitted."""

    def lead_passes(self) -> int:
        """Passes of its own the next proposal's first draft takes (0: free)."""

    def propose(self, history: list[int], pick: int, pos: int, k: int, gate=None) -> Proposal | None:
        """Up to k drafts after ``pick`` (at position ``pos``); ``gate`` may stop
        a source from writing deeper drafts that could not pay."""

    def moved(self, model, state, tokens=None, hidden=None) -> None:
        """The run goes on with another model (decode.py's fallback) whose
        state holds the same rows. ``tokens``/``hidden``: every row and the
        trunk's hidden state of each, when the state was rebuilt by feeding
        them (the source's own rows in that model's state were not copied)."""

    def checkpoint(self):
        """This source's state, for restore()."""

    def restore(self, ck) -> None:
        ...
