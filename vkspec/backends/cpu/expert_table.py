"""A decode row's experts in two calls: ops.expert_mlps of one row whose
experts take q8, with the layer's shared expert in the same calls where it
has the routed experts' shape.

The gates, then the ups, of the row's experts (and the shared expert's) in
one qdot call, every activation in one jit_math.silu, their downs in one call;
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


def applies(w, experts) -> bool:
    """Every one of the row's experts takes q8 (every expert of the layer,
    looked at once: a step runs cold, and its Python with it)."""
    got = w.__dict__.get("_q8_all")
    if got is None:
        got = w.__dict__["_q8_all"] = all(m.gate.acts == m.up.acts == m.down.acts == "q8" for m in w.experts)
    return got or all(m.gate.acts == m.up.acts == m.down.acts == "q8" for m in map(w.experts.__getitem__, experts))


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
    k = len(experts)
    downs = np.append(experts, len(w.experts)) if joined else experts     # the shared expert last
    gates = 2 * downs
    gu = gu_table.each(np.concatenate([gates, gates + 1]), np.ascontiguousarray(h, F), x_rows=1)
    a = jit_math.silu(gu[:len(gates)], times=gu[len(gates):])            # (k (+1), I): gates, then ups
    ys = down_table.each(downs, a)
    return ys[None, :k], (ys[k:] if joined else None)
