"""Usage counts of routed experts, per MoE layer.

Every routed row counts (prompt, decode and verify rows, rejected drafts
included). Counts halve every HALVE_EVERY routed rows of a layer so the
history follows the text. Saved as JSON beside the model
(``expert_usage.json``); a file that is not a history, or is one for another
shape, is an error and is never overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import VkspecError

FORMAT = "vkspec-expert-usage"
FILE_NAME = "expert_usage.json"
HALVE_EVERY = 4096


class History:
    def __init__(self, layers: int, experts: int):
        self.counts = np.zeros((layers, experts), np.float64)
        self.rows = np.zeros(layers, np.int64)

    def add(self, layer: int, experts) -> None:
        """One routed row: its k experts."""
        for e in experts:
            self.counts[layer, int(e)] += 1.0
        self.rows[layer] += 1
        if self.rows[layer] % HALVE_EVERY == 0:
            self.counts[layer] *= 0.5

    def save(self, path: Path) -> None:
        data = {"format": FORMAT, "version": 1, "layers": int(self.counts.shape[0]),
                "experts": int(self.counts.shape[1]), "rows": self.rows.tolist(),
                "counts": self.counts.tolist()}
        tmp = Path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path, layers: int, experts: int) -> "History":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise VkspecError(f"{path}: not an expert-usage history ({e})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise VkspecError(f"{path}: not an expert-usage history (format != {FORMAT!r})")
        if (data.get("layers"), data.get("experts")) != (layers, experts):
            raise VkspecError(f"{path}: history for {data.get('layers')} layers x {data.get('experts')} "
                              f"experts, the model has {layers} x {experts}")
        h = cls(layers, experts)
        try:
            counts = np.asarray(data["counts"], np.float64)
            rows = np.asarray(data["rows"], np.int64)
        except (KeyError, ValueError, TypeError) as e:
            raise VkspecError(f"{path}: damaged expert-usage history ({e})") from None
        if counts.shape != (layers, experts) or rows.shape != (layers,) or (counts < 0).any():
            raise VkspecError(f"{path}: damaged expert-usage history (shapes or negative counts)")
        h.counts, h.rows = counts, rows
        return h
