"""qdot's C calls from numba code: ``q8_gemvs(mats, count, x, threads)`` in a
compiled kernel is vk_q8_gemvs of the library qdot chooses (its Python
twin is qdot.gemvs), and ``q8_gemvs_each(mats, count, xs, ns, threads)``
vk_q8_gemvs_each (qdot.gemvs_each: matrix j against its own input, xs[j]'s
address and ns[j] rows), with no Python between them and the kernel's other
steps; ``wide_scores`` is the library's attention scores for heads wider
than 64 columns (vk_scores), which jit_attend calls where the cell holds it;
``float_rows`` the float weights' rows (vk_float_rows, float_dot.h), which
jit_blocks' GEMV calls where the cell holds it (bind_float).

Why: a sublayer's GEMVs, norms, activations and attention as one compiled
call (jit_sublayer) cost one dispatch from Python instead of a dozen, and a
decoding step at real widths runs its Python with cold caches.

How: the compiled code calls through a cell of three function pointers, an
LLVM symbol of this process (llvmlite's add_symbol), so numba's cache on disk
holds code that asks for the cell by name, never an address. ``bind()``
fills the cell with the library qdot.lib() chooses now (VKSPEC_CPU_ISA read
as qdot reads it); callers bind before each call. An unbound cell is null:
nothing binds at import, which would build the library for an f32 run. The
library is the one qdot's own calls run, so the bits are its bits
(tests/test_q8.py holds every library to the definition, and the compiled
expert calls under each).

mats: an int64 array of qdot.Mat rows (qdot.mat_words), whose output
words (Y, Y + 1: address, stride in floats) the caller fills in for each
call (set_output).
"""

from __future__ import annotations

import ctypes

from . import numba_cache  # noqa: F401,I001  (first: where numba caches)
import llvmlite.binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from . import qdot

Y = qdot._Y                                         # a Mat row's output address; Y + 1: its stride
_CELL_NAME = "vkspec_q8_gemvs_cell"
_SLOTS = 4
_CELL = (ctypes.c_void_p * _SLOTS)()               # vk_q8_gemvs, vk_q8_gemvs_each, vk_scores, vk_float_rows
_BOUND: list = [None]
llvm.add_symbol(_CELL_NAME, ctypes.addressof(_CELL))


def bind() -> None:
    """The cell points at the entry points of the library qdot.lib() chooses."""
    lib = qdot.lib()
    if _BOUND[0] is not lib:
        _CELL[:] = [ctypes.cast(f, ctypes.c_void_p).value
                    for f in (lib.vk_q8_gemvs, lib.vk_q8_gemvs_each, lib.vk_scores, lib.vk_float_rows)]
        _BOUND[0] = lib


_UNBUILT: set = set()                              # qdot.variant()s whose library failed to build


def bind_float() -> None:
    """bind() for a call with f16 or bf16 weights, which the library makes
    fast but does not need: where it cannot be built (no C compiler), the
    cell stays as it is and jit_blocks decodes such rows in numba, to the
    same bits. A failed build is not tried again on every GEMV."""
    v = qdot.variant()
    if v in _UNBUILT:
        return
    try:
        bind()
    except qdot.build.BuildError:
        _UNBUILT.add(v)


def _cell_entry(builder, which: int, fnty):
    """The function pointer in slot ``which`` of the cell."""
    cell = builder.module.globals.get(_CELL_NAME)
    if cell is None:
        cell = ir.GlobalVariable(builder.module, ir.ArrayType(ir.PointerType(ir.IntType(8)), _SLOTS), _CELL_NAME)
        cell.linkage = "external"
    i32 = ir.IntType(32)
    slot = builder.gep(cell, [ir.Constant(i32, 0), ir.Constant(i32, which)])
    return builder.bitcast(builder.load(slot), ir.PointerType(fnty))


def _c_array(t, dtype) -> bool:
    return isinstance(t, types.Array) and t.dtype == dtype and t.layout == "C"


@intrinsic
def _gemvs_cell(typingctx, mats, count, x, n, threads):
    """vk_q8_gemvs(mats, count, x, n, threads) through the cell; its status."""
    if not (_c_array(mats, types.int64) and _c_array(x, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        ptr, i64, i32 = ir.PointerType(ir.IntType(8)), ir.IntType(64), ir.IntType(32)
        fn = _cell_entry(builder, 0, ir.FunctionType(i32, [ptr, i32, ptr, i64, i32]))
        ma, xa = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 2))
        count, thr = (builder.trunc(context.cast(builder, args[i], sig.args[i], types.int64), i32) for i in (1, 4))
        n = context.cast(builder, args[3], sig.args[3], types.int64)
        return builder.call(fn, [builder.bitcast(ma.data, ptr), count, builder.bitcast(xa.data, ptr), n, thr])
    return types.int32(mats, count, x, n, threads), codegen


@intrinsic
def _each_cell(typingctx, mats, count, xs, ns, threads):
    """vk_q8_gemvs_each(mats, count, xs, ns, threads) through the cell; its status."""
    if not (_c_array(mats, types.int64) and _c_array(xs, types.int64) and _c_array(ns, types.int64)):
        return None

    def codegen(context, builder, sig, args):
        ptr, i32 = ir.PointerType(ir.IntType(8)), ir.IntType(32)
        fn = _cell_entry(builder, 1, ir.FunctionType(i32, [ptr, i32, ptr, ptr, i32]))
        ma, xa, na = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 2, 3))
        count, thr = (builder.trunc(context.cast(builder, args[i], sig.args[i], types.int64), i32) for i in (1, 4))
        return builder.call(fn, [builder.bitcast(ma.data, ptr), count, builder.bitcast(xa.data, ptr),
                                 builder.bitcast(na.data, ptr), thr])
    return types.int32(mats, count, xs, ns, threads), codegen


@njit(inline="always", boundscheck=False)
def set_output(mats, i, y):
    """Matrix i of mats writes its (n, rows) output into y (C-contiguous)."""
    mats[i, Y] = y.ctypes.data
    mats[i, Y + 1] = y.shape[1]


@njit(inline="always", boundscheck=False)
def q8_gemvs(mats, count, x, threads):
    """qdot.gemvs: every row of x (n, cols) against matrices 0..count-1 of
    mats, into the outputs set_output gave them."""
    if _gemvs_cell(mats, count, x, x.shape[0], threads):
        raise MemoryError("q8 GEMV: out of memory for its buffers")


@njit(inline="always", boundscheck=False)
def q8_gemvs_each(mats, count, xs, ns, threads):
    """qdot.gemvs_each: matrix j of mats (j < count) against the ns[j] rows
    at address xs[j], into the output set_output (or its words) gave it."""
    if _each_cell(mats, count, xs, ns, threads):
        raise MemoryError("q8 GEMV: out of memory for its buffers")


@intrinsic
def wide_scores_bound(typingctx):
    """Whether the cell holds vk_scores (bind() has run in this process)."""
    return _slot_bound(2)


@intrinsic
def wide_scores(typingctx, kc, g, t0, nkeys, q, q0, nq, out, r, h0, j0, scale):
    """jit_dot.key_scores's call for any head width, through the cell's
    vk_scores (attend_scores.h): out[r, h0 + i, j0 + t] = dot(q[q0 + i],
    kc[g, t0 + t]) * scale for i < nq and t < nkeys, in exact.dot's order;
    kc (nkv, L, hd), q (rows, hd) and out (n, heads, span) C-contiguous
    float32. The caller checks wide_scores_bound() first."""
    if not (_c_array(kc, types.float32) and _c_array(q, types.float32) and _c_array(out, types.float32)
            and (kc.ndim, q.ndim, out.ndim) == (3, 2, 3)):
        return None

    def codegen(context, builder, sig, args):
        from .jit_dot import SCORES_FN, scores_args
        ka, qa, oa = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 4, 7))
        builder.call(_cell_entry(builder, 2, SCORES_FN), scores_args(context, builder, sig, args, ka, qa, oa))
        return context.get_dummy_value()
    return types.none(kc, g, t0, nkeys, q, q0, nq, out, r, h0, j0, scale), codegen


def _slot_bound(which: int):
    def codegen(context, builder, sig, args):
        fn = _cell_entry(builder, which, ir.FunctionType(ir.VoidType(), []))
        return builder.icmp_unsigned("!=", builder.ptrtoint(fn, ir.IntType(64)), ir.Constant(ir.IntType(64), 0))
    return types.boolean(), codegen


@intrinsic
def float_rows_bound(typingctx):
    """Whether the cell holds vk_float_rows (bind() has run in this process)."""
    return _slot_bound(3)


@intrinsic
def float_rows(typingctx, code, data, lo, hi, x, out):
    """vk_float_rows through the cell: out[r, m] = dot(x[r], the values of
    stored row m of data) for lo <= m < hi and every row r of x, in
    exact.dot's order; code is jit_blocks' (0 f32, 1 f16, 2 bf16), data a
    2-d uint8 array whose rows are contiguous, x (n, cols) and out (n, >= hi)
    C-contiguous float32. The caller checks float_rows_bound() first."""
    if not (isinstance(data, types.Array) and data.ndim == 2 and data.dtype == types.uint8
            and all(_c_array(a, types.float32) and a.ndim == 2 for a in (x, out))):
        return None

    def codegen(context, builder, sig, args):
        ptr, i64, i32 = ir.PointerType(ir.IntType(8)), ir.IntType(64), ir.IntType(32)
        fn = _cell_entry(builder, 3, ir.FunctionType(ir.VoidType(), [i32, ptr, i64, i64, ptr, i64, i64, ptr, i64]))
        da, xa, oa = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (1, 4, 5))
        code = builder.trunc(context.cast(builder, args[0], sig.args[0], types.int64), i32)
        lo, hi = (context.cast(builder, args[i], sig.args[i], types.int64) for i in (2, 3))
        stride = builder.extract_value(da.strides, 0)
        ys = builder.extract_value(oa.shape, 1)
        w = builder.gep(builder.bitcast(da.data, ptr), [builder.mul(lo, stride)])
        y = builder.bitcast(builder.gep(oa.data, [lo]), ptr)
        builder.call(fn, [code, w, stride, builder.sub(hi, lo), builder.bitcast(xa.data, ptr),
                          builder.extract_value(xa.shape, 0), builder.extract_value(xa.shape, 1), y, ys])
        return context.get_dummy_value()
    return types.none(code, data, lo, hi, x, out), codegen
