"""Usage counts of routed experts, per MoE layer.

Every routed row counts (prompt, decode and verify rows, rejected drafts
included). Counts halve every HALVE_EVERY routed rows of a layer so the
history follows the text. Saved as JSON (``expert_usage.json``). By default
(``--tier-history`` without a path) it lives in the user's cache, keyed by
the model's content hash (vkspec/cachedir.py), never in the model folder: a
history shipped beside the model is where a first run starts, read only. A
file that is not a history, or is one for another shape, is an error and is
never overwritten; a place that cannot be written costs one warning line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from ..cachedir import model_cache_dir
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

    def save(self, path: Path) -> bool:
        data = {"format": FORMAT, "version": 1, "layers": int(self.counts.shape[0]),
                "experts": int(self.counts.shape[1]), "rows": self.rows.tolist(),
                "counts": self.counts.tolist()}
        path = Path(path)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data) + "\n")
            os.replace(tmp, path)
        except OSError as e:
            print(f"[vkspec tier] warning: the expert-usage history was not saved to {path} "
                  f"({e.strerror or e})", file=sys.stderr)
            return False
        finally:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        return True

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


def default_paths(model) -> tuple[str | None, str | None]:
    """(the history to start from, where to save it) for ``--tier-history``
    without a path: the cache copy once there is one, else the history
    shipped beside the model (read only); saved to the cache copy."""
    cache = model_cache_dir(model)
    saved = cache / FILE_NAME if cache is not None else None
    shipped = Path(model) / FILE_NAME
    if saved is not None and saved.exists():
        return str(saved), str(saved)
    return (str(shipped) if shipped.is_file() else None), (str(saved) if saved is not None else None)
