"""A decode row's experts in two calls: ops.expert_mlps of one row whose
experts take q8, with the layer's shared expert in the same calls where it
has the routed experts' shape.

The gates and ups of the row's experts (and the shared expert's) in one
qdot call, every activation in one jit_math.silu, their downs in one call;
the calls pick the matrices by index from the layer's qdot.Table, made at the
layer's first such row. Each output is what the general path computes for
it (the same quantisation of the row, the same kernels, an activation
element by element): only the grouping by rows, which one row does not
need, and a call per matrix set are left out. tests/test_q8.py holds both to
the general path and to the NumPy definition.
"""

from __future__ import annotations

import numpy as np

from . import jit_math, qdot

F = np.float32
_GATE_UP = np.arange(2)


def applies(w, experts) -> bool:
    """Every one of the row's experts takes q8."""
    return all(m.gate.acts == m.up.acts == m.down.acts == "q8" for m in map(w.experts.__getitem__, experts))


def _tables(w, act: str | None):
    """(gate|up table, down table, whether the shared expert is in them):
    it is where it takes q8, has the routed experts' width and their silu."""
    key = f"_q8_tables_{act}"
    got = w.__dict__.get(key)
    if got is None:
        sh, m0 = w.shared, w.experts[0]
        joined = (sh is not None and act == "silu" and sh.gate.rows == m0.gate.rows and sh.down.cols == m0.down.cols
                  and sh.gate.acts == sh.up.acts == sh.down.acts == "q8")
        extra = [sh.gate, sh.up] if joined else []
        got = w.__dict__[key] = (qdot.Table([q for m in w.experts for q in (m.gate, m.up)] + extra),
                                 qdot.Table([m.down for m in w.experts] + ([sh.down] if joined else [])), joined)
    return got


def one_row(w, experts: np.ndarray, h: np.ndarray, shared_act: str | None = None):
    """(ys (1, k, H), the shared expert's output (1, H) or None): the row's
    k experts in routing order; the shared expert's only where it joins the
    calls (shared_act: the shared expert's activation; None: not asked)."""
    gu_table, down_table, joined = _tables(w, shared_act)
    joined = joined and shared_act is not None
    E, k = len(w.experts), len(experts)
    sel = (2 * experts[:, None] + _GATE_UP).reshape(-1)
    if joined:
        sel = np.concatenate([sel, [2 * E, 2 * E + 1]])
    gu = gu_table.each(sel, np.ascontiguousarray(h, F), x_rows=1)
    a = jit_math.silu(gu[0::2], times=gu[1::2])                       # (k (+1), I)
    ys = down_table.each(np.concatenate([experts, [E]]) if joined else experts, a)
    return ys[None, :k], (ys[k:] if joined else None)
