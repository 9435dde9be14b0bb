"""The selftest's checks of gemv.comp, gemv_q8.comp and quantize_q8.comp.

gemv.comp has 6 variants of each format: two lane layouts (parallel, the
GPUs' default; _serial, Lavapipe's), each plain, _routed (the experts) and
_rowmap (the MTP head's draft vocabulary); gemv_q8.comp the same for each
format q8 activations apply to. Every format runs plain in both layouts;
the routed and row-mapped variants run for formats that stand for the
others' ways of reading a weight. The specialization constants differ with
the input rows in the serial layout, so a few counts run there too.

gemv_q8 reads q8 rows made by the NumPy twin of quantize_q8 (packed as the
shader writes them), so each shader is checked alone.
"""

from __future__ import annotations

import numpy as np

from .backends.cpu import ops
from .backends.vulkan.immediate import q8_rows
from .backends.vulkan.recorder import gemv_variant
from .backends.vulkan.step import NO_SLOT
from .formats.intform import Q8_FORMATS, block_size
from .formats.matrix import FORMATS
from .formats.samples import random_weight
from .selftest_ops import Check, marked, normal

f32 = np.float32
LANES = ("parallel", "serial")
# f32: plain floats; int4-g64: scales outside the data; q4_0: 32-column
# blocks (4 weight rows an invocation in the serial layout); q6_k: a K-quant
KIND_FORMATS = ("f32", "int4-g64", "q4_0", "q6_k")
# int8: no min term; q4_1: a block's added min; q4_k: the K-quants' sub-block mins
Q8_KIND_FORMATS = ("int8", "q4_1", "q4_k")


def _weight(fmt: str, rows: int, cols: int, rng, q8: bool):
    w = random_weight(fmt, rows, cols, rng)
    w.acts = "q8" if q8 else "f32"
    return w


def _device_input(w, x):
    """What the shader reads: float rows, or q8 rows for a weight with q8 activations."""
    return q8_rows(*ops.quantize_q8(x, block_size(w.fmt))) if w.acts == "q8" else x


def plain(fmt: str, lanes: str, n: int, q8: bool = False, acc: bool = False):
    """70 rows (a workgroup part empty in both layouts) of 512 columns times
    n input rows, one of them tiny (products in the denormals); acc: y += it."""
    def run(vk, rng):
        w = _weight(fmt, 70, 512, rng, q8)
        x = normal(rng, n, 512, scale=3)
        if n > 1 and not q8:
            x[1] *= f32(1e-20)
        y = normal(rng, n, 70) if acc else None
        want = ops.gemv(w, x)
        got = vk.gemv_rows(w, _device_input(w, x), lanes, y)
        return [(want if y is None else y + want, got)]
    return run


def routed(fmt: str, lanes: str, q8: bool = False):
    """3 input rows, 2 experts each (6 pairs, x_div 2) of 4, from the
    layer's place in the index buffer; expert 1 has no device slot (its
    pairs are the host's), the others sit in slots out of order."""
    def run(vk, rng):
        E, per, cols, n, k = 4, 40, 256, 3, 2
        whole = _weight(fmt, E * per, cols, rng, q8)
        order = [2, 0, 3]                           # slot s holds expert order[s]
        slot_of = np.full(E, NO_SLOT, np.uint32)
        slot_of[order] = np.arange(len(order))
        slots = whole.take(np.concatenate([np.arange(e * per, (e + 1) * per) for e in order]))
        pairs = np.array([0, 1, 3, 2, 2, 0])
        x = normal(rng, n, cols, scale=3)
        y = marked(n * k, per)
        want = y.copy()
        for j, e in enumerate(pairs):
            if slot_of[e] != NO_SLOT:
                want[j] = ops.gemv(whole.rows_of(e * per, (e + 1) * per), x[j // k : j // k + 1])[0]
        idx = np.concatenate([[3, 3], pairs])
        return [(want, vk.gemv_routed(slots, per, _device_input(whole, x), lanes, idx, 2, slot_of, k, y))]
    return run


def rowmap(fmt: str, lanes: str, n: int, q8: bool = False):
    """12 listed rows of a 70-row matrix, for the part holding rows 16..55:
    the rows that another part holds are left alone."""
    def run(vk, rng):
        M, cols, first, rows = 70, 256, 16, 40
        whole = _weight(fmt, M, cols, rng, q8)
        outside = np.concatenate([np.arange(first), np.arange(first + rows, M)])
        row_of = rng.permutation(np.concatenate([rng.choice(np.arange(first, first + rows), 8, replace=False),
                                                 rng.choice(outside, 4, replace=False)]))
        x = normal(rng, n, cols, scale=3)
        y = marked(n, len(row_of))
        inside = (row_of >= first) & (row_of < first + rows)
        want = y.copy()
        want[:, inside] = ops.gemv(whole.take(row_of[inside]), x)
        got = vk.gemv_rowmap(whole.rows_of(first, first + rows), first, row_of, _device_input(whole, x), lanes, y)
        return [(want, got)]
    return run


def quantize_q8(block: int):
    """Rows with the definition's edge blocks: zeros, subnormals (d below
    the smallest normal), an inf, a NaN, the largest floats."""
    def run(vk, rng):
        x = normal(rng, 7, 512, scale=4)
        x[1] = 0.0
        x[2] = normal(rng, 512) * f32(1e-40)
        x[3, 7], x[4, 300] = np.inf, np.nan
        x[5, :64] = f32(3.4e38) * np.sign(x[5, :64])
        return list(zip(ops.quantize_q8(x, block), vk.quantize_q8(x, block)))
    return run


def _name(stem: str, fmt: str, kind: str, lanes: str, what: str) -> str:
    return f"{stem}.{gemv_variant(FORMATS[fmt].variant, kind, lanes)} {what}"


def _checks(stem: str, formats, kind_formats, q8: bool, counts: dict) -> list[Check]:
    """Every format plain in both layouts (counts: lanes -> input rows),
    the routed and row-mapped variants of kind_formats in both."""
    out = [Check(_name(stem, f, "", lanes, f"x{n}"), plain(f, lanes, n, q8))
           for f in formats for lanes, n in counts.items()]
    out += [Check(_name(stem, f, "routed", lanes, "6 pairs"), routed(f, lanes, q8))
            for f in kind_formats for lanes in LANES]
    return out + [Check(_name(stem, f, "rowmap", lanes, f"x{n}"), rowmap(f, lanes, n, q8))
                  for f in kind_formats for lanes, n in counts.items()]


CHECKS = [
    *_checks("gemv", FORMATS, KIND_FORMATS, False, {"parallel": 8, "serial": 1}),
    *(Check(_name("gemv", f, "", "serial", f"x{n}"), plain(f, "serial", n)) for f, n in
      (("q4_0", 3), ("q4_k", 3), ("q4_k", 8))),
    Check(_name("gemv", "q4_k", "", "serial", "x3 acc"), plain("q4_k", "serial", 3, acc=True)),
    Check(_name("gemv", "q4_0", "", "parallel", "x8 acc"), plain("q4_0", "parallel", 8, acc=True)),
    *(Check(f"quantize_q8.b{b}", quantize_q8(b)) for b in (32, 256)),
    *_checks("gemv_q8", Q8_FORMATS, Q8_KIND_FORMATS, True, {"parallel": 3, "serial": 1}),
    Check(_name("gemv_q8", "q4_k", "", "serial", "x8"), plain("q4_k", "serial", 8, q8=True)),
    Check(_name("gemv_q8", "q4_k", "", "serial", "x1 acc"), plain("q4_k", "serial", 1, q8=True, acc=True)),
]
