"""Progress bars where a user waits (weights uploaded, pipelines recorded):
tqdm on stderr when stderr is a terminal, nothing otherwise (a log, a pipe,
a test). VKSPEC_PROGRESS=0 or 1 overrides the terminal check."""

from __future__ import annotations

import os
import sys


class _Silent:
    def update(self, n=1):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def shown() -> bool:
    forced = os.environ.get("VKSPEC_PROGRESS")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):     # a replaced or closed stderr
        return False


def bar(total: int, desc: str, unit: str = "it"):
    """A context manager with ``update(n)``; silent unless shown()."""
    if not shown() or total <= 0:
        return _Silent()
    from tqdm import tqdm
    return tqdm(total=total, desc=f"[vkspec] {desc}", unit=unit, unit_scale=unit == "B",
                unit_divisor=1024 if unit == "B" else 1000, file=sys.stderr, leave=False,
                dynamic_ncols=True)
