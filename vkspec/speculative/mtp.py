"""Drafts from the checkpoint's MTP head (depth 1..7).

A **pair** (h, t, p) is the trunk's hidden state at position p-1 and the token
at position p; the head turns it into its own hidden state and logits for
position p+1, and writes its KV row p. The first draft reads the trunk's last
hidden state with the last pick; each deeper draft reads the head's own
previous hidden state with the draft just proposed. Those deeper rows write
the head's KV past its settled rows: a tail that the settled pairs overwrite
when they are **absorbed** (fed to the head, a few rows per call) at the next
proposal. The head sees every fed position, prompt included.
"""

from __future__ import annotations

import time

import numpy as np

from .source import Proposal
from .vocab import DraftVocab


class MtpDrafts:
    name = "mtp"
    free = False

    def __init__(self, model, vocab: DraftVocab | None = None):
        if not model.has_mtp:
            from ..errors import VkspecError
            raise VkspecError("--spec mtp needs a checkpoint with an MTP head (mtp.fc.weight)")
        self.model = model
        self.vocab = vocab or DraftVocab(model.cfg.vocab_size, 0)
        self.pending: list[tuple[np.ndarray, int, int]] = []
        self.h_last: np.ndarray | None = None
        self.absorbed = -1                      # last position whose head row is settled

    def begin(self, model, state, prompt, fed=0):
        """A request starts; with fed > 0 the state (and this source's own, restored
        by the caller) already holds the first fed prompt tokens."""
        self.state = state
        if not fed:
            self.pending, self.h_last, self.absorbed = [], None, -1
        self.vocab.begin(prompt, fed)

    def observe(self, tokens, hidden, start_pos):
        """Rows that stood in the trunk: tokens at start_pos.., their hidden states."""
        for r, t in enumerate(tokens):
            p = start_pos + r
            if self.h_last is not None and p > self.absorbed:
                self.pending.append((self.h_last, int(t), p))
            self.h_last = np.asarray(hidden[r], np.float32)

    def prefilled(self):
        """The prompt is in: the head reads its rows now (part of the time to
        first token), not at the first draft."""
        if len(self.pending) > 1:
            self._head(self.pending)
            self.absorbed = self.pending[-1][2]
            self.pending = []

    def picked(self, tok: int):
        self.vocab.picked(tok)

    def moved(self, model, state, tokens=None, hidden=None):
        """Another model holds the rows now. Without its head rows (a state
        rebuilt by feeding ``tokens``) every pair is pending again: the next
        proposal writes the head's rows anew, with the same bits."""
        self.model, self.state = model, state
        if tokens is not None:
            self.pending, self.h_last, self.absorbed = [], None, -1
            if len(tokens):
                self.observe(tokens, hidden, 0)

    def checkpoint(self):
        return (list(self.pending), self.h_last, self.absorbed, self.vocab.checkpoint())

    def restore(self, ck):
        self.pending, self.h_last, self.absorbed, v = list(ck[0]), ck[1], ck[2], ck[3]
        self.vocab.restore(v)

    def _head(self, pairs):
        m, out = self.model, None
        for i in range(0, len(pairs), m.max_rows):
            chunk = pairs[i:i + m.max_rows]
            out = m.mtp_forward(np.stack([h for h, _, _ in chunk]), [t for _, t, _ in chunk],
                                self.state, [p for _, _, p in chunk], logits_rows="last", ids=self.vocab.listed)
        return out[0][-1], out[1][-1]

    def lead_passes(self) -> int:
        """Head passes the next proposal's first draft takes: the rows that
        stood since the last one, and the pick, a block at a time."""
        return -(-(len(self.pending) + 1) // self.model.max_rows)

    def propose(self, history, pick: int, pos: int, k: int, gate=None) -> Proposal | None:
        """Up to k drafts after ``pick`` (at position ``pos``); ``gate`` may stop
        writing deeper drafts that could not pay for their verify row."""
        k = min(k, self.model.ctx - 1 - pos)
        if k <= 0 or self.h_last is None:
            return None
        t_lead, passes = time.perf_counter(), self.lead_passes()
        h, logits = self._head(self.pending + [(self.h_last, pick, pos)])
        self.pending, self.absorbed = [], pos
        d, p = self.vocab.best(logits, listed=self.vocab.listed is not None)
        lead = time.perf_counter() - t_lead          # the passes and the pick of draft 1
        drafts, probs, t0 = [d], [p], time.perf_counter()
        while len(drafts) < k and (gate is None or gate.deeper_p(self.name, len(drafts), probs)):
            h, logits = self._head([(h, drafts[-1], pos + len(drafts))])
            d, p = self.vocab.best(logits, listed=self.vocab.listed is not None)
            drafts.append(d)
            probs.append(p)
        seconds = time.perf_counter() - t0 if len(drafts) > 1 else 0.0
        return Proposal(self.name, drafts, probs, seconds, lead=lead, passes=passes)
