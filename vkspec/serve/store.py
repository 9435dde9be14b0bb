"""Saved states (turn snapshots and pins) within a byte budget.

Every entry's cost is measured: the bytes of the host arrays in its model
snapshot and its draft sources' checkpoints (each array once). Over the
budget, turn snapshots go first, least recently used first; then pins, least
recently used first (a pin is something a client asked for, so it outlives
any turn snapshot). An entry larger than the whole budget is not kept.
Reads and writes take only the store's own short lock, never the engine's,
so listing or deleting pins does not wait for a running turn.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..interface import HostState


@dataclass
class Saved:
    fed: tuple
    snap: HostState                 # the model's state (Model.snapshot)
    sources: list
    nbytes: int = 0


def measure(*objs) -> int:
    """Bytes of the distinct NumPy arrays reachable through dataclasses
    (a model State), lists, tuples, sets and dicts."""
    seen, total, stack = set(), 0, list(objs)
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            total += o.nbytes
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            stack.extend(vars(o).values())
    return total


class BudgetError(Exception):
    pass


class StateStore:
    def __init__(self, budget_bytes: int, max_turns: int = 16, log=None):
        self.budget, self.max_turns = int(budget_bytes), max_turns
        self.lock = threading.Lock()
        self.turns: OrderedDict[tuple, Saved] = OrderedDict()       # oldest use first
        self.pinned: OrderedDict[str, Saved] = OrderedDict()
        self.log = log or (lambda msg: print(f"[vkspec serve] {msg}", file=sys.stderr, flush=True))

    def _used(self) -> int:
        return sum(s.nbytes for s in self.turns.values()) + sum(s.nbytes for s in self.pinned.values())

    def usage(self) -> dict:
        """The pins (oldest use first) with their bytes, and the budget's use."""
        with self.lock:
            return {"data": [{"name": n, "tokens": len(s.fed), "bytes": s.nbytes} for n, s in self.pinned.items()],
                    "budget_bytes": self.budget, "used_bytes": self._used(),
                    "turn_snapshots": len(self.turns)}

    def candidates(self) -> list[tuple[tuple, Saved]]:
        with self.lock:
            return [(s.fed, s) for s in self.turns.values()] + [(s.fed, s) for s in self.pinned.values()]

    def touch(self, saved: Saved):
        """A turn started from this entry: it is the most recently used."""
        with self.lock:
            for d in (self.turns, self.pinned):
                for k, v in d.items():
                    if v is saved:
                        d.move_to_end(k)
                        return

    def put_turn(self, saved: Saved):
        with self.lock:
            self.turns.pop(saved.fed, None)
            if saved.nbytes > self.budget:
                return
            self.turns[saved.fed] = saved
            while len(self.turns) > self.max_turns:
                self.turns.popitem(last=False)
            self._fit()

    def put_pin(self, name: str, saved: Saved):
        if saved.nbytes > self.budget:
            raise BudgetError(f"the pin's state is {saved.nbytes} bytes; the state budget is {self.budget} "
                              "(--state-budget-mb)")
        with self.lock:
            self.pinned.pop(name, None)
            self.pinned[name] = saved
            self._fit(keep=name)

    def unpin(self, name: str) -> bool:
        with self.lock:
            return self.pinned.pop(name, None) is not None

    def _fit(self, keep: str | None = None):
        while self._used() > self.budget and self.turns:
            self.turns.popitem(last=False)
        for name in list(self.pinned):
            if self._used() <= self.budget:
                break
            if name != keep:
                self.log(f"pin {name!r} dropped: the state budget of {self.budget} bytes is full")
                del self.pinned[name]
