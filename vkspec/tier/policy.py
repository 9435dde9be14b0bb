"""Placement: which experts of each MoE layer hold a device slot.

Terms:
* slot: room for one expert (its gate/up and down matrices) on the device;
  the budget in bytes buys ``budget // expert_bytes`` slots in all.
* balance: with it, slots go to layers by their share of the history's most
  used experts (each layer keeps at least one when there are enough); without
  it, every layer gets the same number.
* rate: at most this many uploads per forward (admission of a more used
  expert, eviction of the least used resident one).
"""

from __future__ import annotations

import numpy as np


def split_slots(total: int, counts: np.ndarray, experts: int, balance: bool) -> list[int]:
    layers = counts.shape[0]
    if total >= layers * experts:
        return [experts] * layers
    if not balance or counts.sum() == 0:
        base = [total // layers] * layers
        for i in range(total - sum(base)):
            base[i] += 1
        return base
    caps = [0] * layers
    if total >= layers:
        caps = [1] * layers
    # the rest by the global ranking of (layer, expert) counts, each layer's
    # best expert already counted by its first slot
    order = np.argsort(-counts, axis=None, kind="stable")
    taken = [0] * layers
    left = total - sum(caps)
    for flat in order:
        if left <= 0:
            break
        layer = int(flat // experts)
        taken[layer] += 1
        if taken[layer] > caps[layer] and caps[layer] < experts:
            caps[layer] += 1
            left -= 1
    return caps


class Placement:
    """Resident experts per layer and the uploads that move toward the best set."""

    def __init__(self, caps: list[int], experts: int, rate: int):
        self.caps, self.experts, self.rate = caps, experts, rate
        self.slots: list[list[int | None]] = [[None] * c for c in caps]   # slot -> expert

    def resident(self, layer: int) -> dict[int, int]:
        return {e: s for s, e in enumerate(self.slots[layer]) if e is not None}

    def initial(self, counts: np.ndarray) -> list[tuple[int, int, int]]:
        """Fill every slot with the most used experts (lower id on a tie)."""
        moves = []
        for layer, cap in enumerate(self.caps):
            best = np.argsort(-counts[layer], kind="stable")[:cap]
            for s, e in enumerate(sorted(int(x) for x in best)):
                moves.append((layer, s, e))
        self.apply(moves)
        return moves

    def step(self, counts: np.ndarray) -> list[tuple[int, int, int]]:
        """Up to `rate` uploads: (layer, slot, expert), most gain first."""
        cands = []
        for layer, cap in enumerate(self.caps):
            if cap == 0 or cap >= self.experts:
                continue
            res = self.resident(layer)
            c = counts[layer]
            outside = [e for e in range(self.experts) if e not in res]
            if not outside:
                continue
            ins = max(outside, key=lambda e: (c[e], -e))
            empty = [s for s, e in enumerate(self.slots[layer]) if e is None]
            if empty:
                cands.append((c[ins], layer, empty[0], ins))
                continue
            out = min(res, key=lambda e: (c[e], -e))
            if c[ins] > c[out]:
                cands.append((c[ins] - c[out], layer, res[out], ins))
        cands.sort(key=lambda t: (-t[0], t[1]))
        moves = [(layer, s, e) for _, layer, s, e in cands[:self.rate]]
        self.apply(moves)
        return moves

    def apply(self, moves):
        for layer, s, e in moves:
            self.slots[layer][s] = e
