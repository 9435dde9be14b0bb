"""Feeding a prompt: the one prefill that decoding, the server's pins and the
CPU fallback's replay share."""

from __future__ import annotations

import numpy as np


def prefill(model, st, rows: list[int], start: int = 0, *, sources=(), block: int | None = None,
            keep_hidden: bool = False):
    """Feed ``rows[start:]`` into ``st`` in blocks of ``block`` rows (the
    backend's largest by default: a row's bits do not depend on its block).
    Each draft source observes every block, and is told when the prompt is in.

    Returns (the logits of the last block fed or None, the hidden state of
    every row fed when ``keep_hidden``). An exception carries ``fed``: the
    rows before it stood (a failed forward may have moved the watermark past
    them, its rows computed but never read), and ``logits``: the last block's
    that stood, or None."""
    block = block or model.max_rows
    logits, hidden = None, [np.zeros((0, model.cfg.hidden_size), np.float32)] if keep_hidden else None
    i = start
    try:
        while i < len(rows):
            part = rows[i:i + block]
            h, logits = model.forward(part, st, logits_rows="last")
            for src in sources:
                src.observe(part, h, i)
            if keep_hidden:
                hidden.append(np.asarray(h, np.float32))
            i += len(part)
        for src in sources:
            src.prefilled()          # the MTP head reads the prompt's rows here
    except BaseException as e:
        e.fed, e.logits = i, logits
        raise
    return logits, (np.concatenate(hidden) if keep_hidden else None)
