"""The canonical dot product (exact.dot's order) as LLVM IR generated for the
CPU in front of us, for numba kernels: ``dot(w, x)`` and ``dot_rows(w, X, r0,
n, out)`` (rows r0..r0+n-1 of X, n <= 8, every weight vector loaded once for
all of them); and the attention's kernels, ``key_scores`` (the scores of
heads up to 64 wide, sixteen keys at a time), ``query_scores`` (a KV head's
queries one a lane) and ``row_values`` (one query's weighted values), whose
IR is jit_ir's scores_ir, query_scores_ir and row_values_ir.

Why IR: the definition keeps 128 running lanes (exact.REDUCE_LANES x
REDUCE_VEC). Written in numba they live in a heap array, so each product
costs a load and a store of its lane besides the two operand loads. Here the
lanes are SSA values held in vector registers.

Registers: 128 lanes of n rows do not fit every register file (AVX2 has 16
ymm registers, 8 floats each: one row's 128 lanes alone take all 16, and
spill). The canonical order fixes which products go to which lane and their
order within a lane, not the order in which lanes are visited, so the lanes
go in P passes of 128 / P: each pass walks the whole row for its lanes only
and parks them in a small stack buffer. The weight row is in L1 after the
first pass. P is the smallest power of two that keeps n rows' accumulators
within the register budget of the ISA (ISAS).

Why it is exact: lane j of output r is +0, then + x_r[128c + j] * w[128c + j]
for c ascending, one ``fmul`` then one ``fadd`` with no fast-math flags, so
LLVM may neither fuse nor reassociate them. A last partial step loads zeros
past k (the definition's zero padding: +0 products, and no lane is ever -0).
The finish is exact._finish's order: (a[4l] + a[4l+1]) + (a[4l+2] + a[4l+3])
per lane l, then s[i] + s[i + stride] for stride 16, 8, 4, 2, 1, written as
even/odd and low/high shuffles. ``test_exact_core`` holds every kernel that
uses these to exact.gemv bit for bit, for every ISA, and reads their machine
code for fused multiply-adds. (x86 may swap a product's operands, so when x
and w are both NaN in one column the payload can be w's: NaN payloads are
outside the contract.)

Callers must pass w and every x row with at least k elements (nothing here
checks; gemv asserts it in Python).

ISA: VKSPEC_CPU_ISA (avx512, avx2 or plain) forces one, else the host's best.
numba caches callers' machine code keyed on their own files, not on this IR,
so the cache lives in a folder named after the IR's digest (backends/cpu/
numba_cache.py): a different IR, or ISA, never meets old code.
"""

from __future__ import annotations

from . import numba_cache  # noqa: F401,I001  (first: where numba caches)
import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, register_jitable

from .jit_ir import (BEST_ROWS, ISA, MAX_ROWS, QUERY_GROUPS, QUERY_LANES, _ir, chunk_rows,  # noqa: F401
                     query_scores_ir, row_values_ir, scores_ir)

DOT_ROWS = BEST_ROWS[ISA]   # rows a dot_rows call takes where a caller has more (chunk_rows)
register_jitable(chunk_rows)


_LIBRARIES = {}
SCORES_DIMS = 64            # the widest head key_scores takes


def _library(context):
    """The kernels compiled once per process, linked into each numba function
    that calls them (numba's cache keeps the linked code)."""
    key = id(context.codegen())
    if key not in _LIBRARIES:
        lib = context.codegen().create_library("vkspec_dot")
        for text in ([_ir(rows) for rows in range(1, MAX_ROWS + 1)] + [row_values_ir(), scores_ir()]
                     + [query_scores_ir(g) for g in range(1, QUERY_GROUPS + 1)]):
            module = llvm.parse_assembly(text)
            module.verify()
            lib.add_llvm_module(module)
        _LIBRARIES[key] = lib
    return _LIBRARIES[key]


def _declare(builder, rows):
    ptr, i64 = ir.PointerType(ir.IntType(8)), ir.IntType(64)
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64, ptr, i64]),
                                          f"vkspec_dot{rows}")


def _c_arrays(arrays, ndims, dtype=types.float32) -> bool:
    """Whether each of the numba types is a C-contiguous array of dtype and
    of its ndim."""
    return all(isinstance(a, types.Array) and a.layout == "C" and a.dtype == dtype and a.ndim == d
               for a, d in zip(arrays, ndims, strict=True))


def _cache_row(builder, cache, t, g):
    """(pointer to cache[g, t, 0], row stride in floats) of a (nkv, L, hd)
    cache's array struct (heap.heads_first: a head's keys one after another)."""
    rows, hd = builder.extract_value(cache.shape, 1), builder.extract_value(cache.shape, 2)
    return builder.gep(cache.data, [builder.mul(builder.add(builder.mul(g, rows), t), hd)]), hd


@intrinsic
def dot(typingctx, w, x):
    """dot(x, w[:len(x)]) in the canonical order; w must hold at least len(x)."""
    if not _c_arrays((w, x), (1, 1)):
        return None

    def codegen(context, builder, sig, args):
        ptr, i64 = ir.PointerType(ir.IntType(8)), ir.IntType(64)
        wa, xa = linked_arrays(_library, context, builder, sig, args, 0, 1)
        out = cgutils.alloca_once(builder, ir.FloatType())
        builder.call(_declare(builder, 1), [builder.bitcast(wa.data, ptr), builder.bitcast(xa.data, ptr),
                                            ir.Constant(i64, 0), builder.bitcast(out, ptr),
                                            builder.extract_value(xa.shape, 0)])
        return builder.load(out)
    return types.float32(w, x), codegen


def linked_arrays(library, context, builder, sig, args, *which):
    """For an intrinsic's codegen: links library(context) (the generated
    kernels) into the function being compiled; the array structs of
    args[which]."""
    context.active_code_library.add_linking_library(library(context))
    return [context.make_array(sig.args[i])(context, builder, args[i]) for i in which]


def call_for_rows(builder, n, most, kernel, args, label):
    """Calls kernel(rows)(*args) for the run-time row count n in 1..most: each
    row count is its own generated kernel (its accumulators are registers)."""
    i64 = ir.IntType(64)
    done = builder.append_basic_block(f"{label}.done")
    switch = builder.switch(n, done)
    for rows in range(1, most + 1):
        bb = builder.append_basic_block(f"{label}.{rows}")
        switch.add_case(ir.Constant(i64, rows), bb)
        with builder.goto_block(bb):
            builder.call(kernel(rows), args)
            builder.branch(done)
    builder.position_at_end(done)


@intrinsic
def dot_rows(typingctx, w, x, r0, n, out):
    """out[i] = dot(x[r0 + i], w[:x.shape[1]]) for i < n (1 <= n <= MAX_ROWS),
    each weight vector loaded once for all n rows; x is a C-contiguous
    (rows, k) float32 array."""
    if not (isinstance(w, types.Array) and w.ndim == 1 and w.dtype == types.float32
            and isinstance(x, types.Array) and x.ndim == 2 and x.layout == "C" and x.dtype == types.float32
            and isinstance(out, types.Array) and out.ndim == 1 and out.dtype == types.float32):
        return None

    def codegen(context, builder, sig, args):
        ptr = ir.PointerType(ir.IntType(8))
        wa, xa, oa = linked_arrays(_library, context, builder, sig, args, 0, 1, 4)
        k = builder.extract_value(xa.shape, 1)
        first = builder.gep(xa.data, [builder.mul(context.cast(builder, args[2], sig.args[2], types.int64), k)])
        n64 = context.cast(builder, args[3], sig.args[3], types.int64)
        call = [builder.bitcast(wa.data, ptr), builder.bitcast(first, ptr), k, builder.bitcast(oa.data, ptr), k]
        call_for_rows(builder, n64, MAX_ROWS, lambda rows: _declare(builder, rows), call, "dot_rows")
        return context.get_dummy_value()
    return types.none(w, x, r0, n, out), codegen


@intrinsic
def row_values(typingctx, p, vc, g, base, lo, hi, out):
    """out[e] = dot(p[lo:hi], vc[g, base + lo:base + hi, e]) for every e <
    hd in exact.dot's order, key j (from base, a multiple of 128) in lane
    j mod 128 (jit_ir.row_values_ir); p (>= hi), vc (nkv, L, hd) and out
    (hd) C-contiguous float32, base + hi <= L."""
    if not _c_arrays((p, vc, out), (1, 3, 1)):
        return None

    def codegen(context, builder, sig, args):
        ptr, i64 = ir.PointerType(ir.IntType(8)), ir.IntType(64)
        pa, va, oa = linked_arrays(_library, context, builder, sig, args, 0, 1, 6)
        g, base, lo, hi = (context.cast(builder, args[i], sig.args[i], types.int64) for i in range(2, 6))
        first, stride = _cache_row(builder, va, base, g)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr, ptr] + [i64] * 4 + [ptr]),
                                            "vkspec_row_values")
        builder.call(fn, [builder.bitcast(pa.data, ptr), builder.bitcast(first, ptr), stride, lo, hi,
                          builder.extract_value(va.shape, 2), builder.bitcast(oa.data, ptr)])
        return context.get_dummy_value()
    return types.none(p, vc, g, base, lo, hi, out), codegen


@intrinsic
def key_scores(typingctx, kc, g, t0, nkeys, q, q0, nq, out, r, h0, j0, scale):
    """out[r, h0 + i, j0 + t] = dot(q[q0 + i], kc[g, t0 + t]) * scale for i <
    nq and t < nkeys (jit_ir.scores_ir, head dims up to 64); kc (nkv, L, hd),
    q (rows, hd) and out (n, heads, span) C-contiguous float32."""
    if not _c_arrays((kc, q, out), (3, 2, 3)):
        return None

    def codegen(context, builder, sig, args):
        ka, qa, oa = linked_arrays(_library, context, builder, sig, args, 0, 4, 7)
        fn = cgutils.get_or_insert_function(builder.module, SCORES_FN, "vkspec_scores")
        builder.call(fn, scores_args(context, builder, sig, args, ka, qa, oa))
        return context.get_dummy_value()
    return types.none(kc, g, t0, nkeys, q, q0, nq, out, r, h0, j0, scale), codegen


_PTR, _I64 = ir.PointerType(ir.IntType(8)), ir.IntType(64)
# (k, k_stride, q, q_stride, nq, out, out_stride, nkeys, d, scale): vkspec_scores and qdot's vk_scores
SCORES_FN = ir.FunctionType(ir.VoidType(), [_PTR, _I64, _PTR, _I64, _I64, _PTR, _I64, _I64, _I64, ir.FloatType()])


def scores_args(context, builder, sig, args, ka, qa, oa) -> list:
    """SCORES_FN's arguments for a key_scores-shaped call (kc, g, t0, nkeys,
    q, q0, nq, out, r, h0, j0, scale), from the array structs of kc, q and out."""
    g, t0, nkeys, q0, nq, r, h0, j0 = (context.cast(builder, args[i], sig.args[i], types.int64)
                                       for i in (1, 2, 3, 5, 6, 8, 9, 10))
    (k, ks), hd = _cache_row(builder, ka, t0, g), builder.extract_value(ka.shape, 2)
    qs = builder.extract_value(qa.shape, 1)
    heads, span = builder.extract_value(oa.shape, 1), builder.extract_value(oa.shape, 2)
    o = builder.gep(oa.data, [builder.add(builder.mul(builder.add(builder.mul(r, heads), h0), span), j0)])
    return [builder.bitcast(k, _PTR), ks, builder.bitcast(builder.gep(qa.data, [builder.mul(q0, qs)]), _PTR),
            qs, nq, builder.bitcast(o, _PTR), span, nkeys, hd, context.cast(builder, args[11], sig.args[11], types.float32)]


@intrinsic
def query_scores(typingctx, kc, g, t0, nkeys, qt, out, scale):
    """out[t, i] = dot(q_i, kc[g, t0 + t]) * scale for t < nkeys and the
    QUERY_LANES queries whose columns are qt's rows (qt (d, QUERY_LANES), d
    a multiple of 4 up to 64; jit_ir.query_scores_ir); kc (nkv, L, d), qt
    and out (>= nkeys, QUERY_LANES) C-contiguous float32."""
    if not _c_arrays((kc, qt, out), (3, 2, 2)):
        return None

    def codegen(context, builder, sig, args):
        ptr, i64 = ir.PointerType(ir.IntType(8)), ir.IntType(64)
        ka, qa, oa = linked_arrays(_library, context, builder, sig, args, 0, 4, 5)
        g, t0, nkeys = (context.cast(builder, args[i], sig.args[i], types.int64) for i in (1, 2, 3))
        (k, ks), hd = _cache_row(builder, ka, t0, g), builder.extract_value(ka.shape, 2)
        scale = context.cast(builder, args[6], sig.args[6], types.float32)
        call = [builder.bitcast(k, ptr), ks, builder.bitcast(qa.data, ptr), builder.bitcast(oa.data, ptr), nkeys, scale]
        groups = builder.lshr(hd, ir.Constant(i64, 2))
        fn = ir.FunctionType(ir.VoidType(), [ptr, i64, ptr, ptr, i64, ir.FloatType()])
        call_for_rows(builder, groups, QUERY_GROUPS,
                      lambda gr: cgutils.get_or_insert_function(builder.module, fn, f"vkspec_qscores{gr}"), call, "qscores")
        return context.get_dummy_value()
    return types.none(kc, g, t0, nkeys, qt, out, scale), codegen


@intrinsic
def threads(typingctx):
    """The threads a parallel loop runs on now (numba.get_num_threads), read
    through the threading layer's own symbol as numba's parallel loops read
    it: numba's get_num_threads calls a ctypes pointer, and a function that
    holds one is not cached."""
    from numba.np.ufunc.parallel import _launch_threads
    _launch_threads()

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(cgutils.intp_t, []), "get_num_threads")
        return builder.call(fn, [])
    return types.intp(), codegen


@intrinsic
def claim(typingctx, counter, n):
    """counter[0] += n as one atomic step; returns the value before: the
    first of n work items a thread takes from a queue shared by the threads
    of a parallel loop (counter a C-contiguous int64 array)."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64 and counter.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        ca = context.make_array(sig.args[0])(context, builder, args[0])
        n = context.cast(builder, args[1], sig.args[1], types.int64)
        return builder.atomic_rmw("add", ca.data, n, "seq_cst")
    return types.int64(counter, n), codegen


def machine_code() -> str:
    """The kernels' own assembly (in callers' inspect_asm they are inlined,
    hard to tell apart); call after a caller has compiled."""
    from numba.core.registry import cpu_target
    return _library(cpu_target.target_context).get_asm_str()
