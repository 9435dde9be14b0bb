"""The block formats' inner loops (jit_ir.unpack_ir) called from numba:
``unpack(KIND, row, at, out, y, d, m, shift)`` decodes the quants at
row[at:] into out[y:] (16 bytes into 32 values, or 32 into 32).

Why: numba compiles a loop over uint8 quants to one scalar int-to-float
conversion a value (LLVM does not vectorise it); here a block's values come
out of a few vector instructions. tests/test_formats.py holds the decoders that use these
to formats/ggml.py bit for bit, edge blocks included.

Callers guarantee the bytes and the 32 floats are there (nothing checks).
"""

from __future__ import annotations

from . import numba_cache  # noqa: F401,I001  (first: where numba caches)
import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit_dot import MAX_ROWS, call_for_rows, linked_arrays
from .jit_ir import ISA, unpack_ir
from .jit_ir_blocks import blocks_ir
from .jit_ir_groups import CODES, COLUMNS, FORMATS, group_order
from .jit_ir_staged import staged

FUSED_ROWS = MAX_ROWS                             # every ISA (past fused_passes' reach, staged)
ORDERED = group_order(ISA) != COLUMNS             # gemv_fused reads its input rows through order_x
# STAGED[n]: the n-row kernels are staged and read their input rows through order_staged
STAGED = np.array([n > 0 and staged(n) for n in range(MAX_ROWS + 1)])

Q4_0, Q4_1, Q4_K, Q8_0 = 0, 1, 2, 3
_NAMES = ("vkspec_q4_0", "vkspec_q4_1", "vkspec_q4_k", "vkspec_q8_0")
_LIBRARIES = {}


def _library(context):
    key = id(context.codegen())
    if key not in _LIBRARIES:
        lib = context.codegen().create_library("vkspec_unpack")
        for text in (unpack_ir(), blocks_ir()):
            module = llvm.parse_assembly(text)
            module.verify()
            lib.add_llvm_module(module)
        _LIBRARIES[key] = lib
    return _LIBRARIES[key]


@intrinsic
def unpack(typingctx, kind, row, at, out, y, d, m, shift):
    """kind a compile-time constant (Q4_0 .. Q8_0); d, m float32; shift the
    Q4_K nibble's shift (0 or 4)."""
    if not (isinstance(kind, types.IntegerLiteral) and isinstance(row, types.Array) and row.dtype == types.uint8
            and isinstance(out, types.Array) and out.dtype == types.float32):
        return None
    name = _NAMES[kind.literal_value]

    def codegen(context, builder, sig, args):
        ptr, f32, i8 = ir.PointerType(ir.IntType(8)), ir.FloatType(), ir.IntType(8)
        ra, oa = linked_arrays(_library, context, builder, sig, args, 1, 3)
        src = builder.gep(ra.data, [context.cast(builder, args[2], sig.args[2], types.int64)])
        dst = builder.gep(oa.data, [context.cast(builder, args[4], sig.args[4], types.int64)])
        dv = context.cast(builder, args[5], sig.args[5], types.float32)
        mv = context.cast(builder, args[6], sig.args[6], types.float32)
        call = [builder.bitcast(src, ptr), builder.bitcast(dst, ptr), dv]
        params = [ptr, ptr, f32]
        if name != "vkspec_q8_0":
            call.append(mv)
            params.append(f32)
        if name == "vkspec_q4_k":
            call.append(builder.trunc(context.cast(builder, args[7], sig.args[7], types.int64), i8))
            params.append(i8)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), params), name)
        builder.call(fn, call)
        return context.get_dummy_value()
    return types.none(kind, row, at, out, y, d, m, shift), codegen


FUSED = np.zeros(max(CODES.values()) + 1, np.bool_)           # jit_blocks' code -> has a fused kernel
FUSED[[CODES[name] for name in FORMATS]] = True


@intrinsic
def gemv_fused(typingctx, kind, data, r0, r1, x, x0, nx, out):
    """out[x0 + i, m] = dot(x[x0 + i], row m's values) for i < nx (1 <=
    nx <= FUSED_ROWS) and stored rows r0 <= m < r1 of the 2-d block array
    `data`; kind is the format's jit_blocks code, one with FUSED[kind] (any
    other does nothing). x (its groups put in order by order_staged where
    STAGED[nx], else by order_x where ORDERED) and out are C-contiguous 2-d
    float32 arrays."""
    if not (all(isinstance(a, types.Array) and a.ndim == 2 for a in (data, x, out)) and data.dtype == types.uint8
            and x.dtype == types.float32 and out.dtype == types.float32 and x.layout == "C" and out.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        ptr, i64 = ir.PointerType(ir.IntType(8)), ir.IntType(64)
        da, xa, oa = linked_arrays(_library, context, builder, sig, args, 1, 4, 7)
        code, lo, hi, x0, nx = (context.cast(builder, args[i], sig.args[i], types.int64) for i in (0, 2, 3, 5, 6))
        stride = builder.extract_value(da.strides, 0)
        xs, os_ = builder.extract_value(xa.shape, 1), builder.extract_value(oa.shape, 1)
        fty = ir.FunctionType(ir.VoidType(), [ptr, i64, ptr, i64, ptr, i64, i64, i64])
        done = builder.append_basic_block("gemv_fused.done")
        switch = builder.switch(code, done)
        for fmt, f in FORMATS.items():
            bb = builder.append_basic_block(f"gemv_fused.{fmt}")
            switch.add_case(ir.Constant(i64, CODES[fmt]), bb)
            with builder.goto_block(bb):
                units = builder.mul(builder.udiv(builder.extract_value(da.shape, 1), ir.Constant(i64, f.bytes)),
                                    ir.Constant(i64, f.values // 32))
                call = [builder.gep(builder.bitcast(da.data, ptr), [builder.mul(lo, stride)]), stride,
                        builder.bitcast(builder.gep(xa.data, [builder.mul(x0, xs)]), ptr), xs,
                        builder.bitcast(builder.gep(oa.data, [builder.add(builder.mul(x0, os_), lo)]), ptr), os_,
                        builder.sub(hi, lo), units]
                call_for_rows(builder, nx, FUSED_ROWS,
                              lambda n, fmt=fmt: cgutils.get_or_insert_function(builder.module, fty,
                                                                                  f"vkspec_gemv{n}_{fmt}"),
                              call, f"gemv_fused.{fmt}")
                builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()
    return types.none(kind, data, r0, r1, x, x0, nx, out), codegen


def _ordering(name: str, doc: str):
    def order(typingctx, x, xp):
        if not (all(isinstance(a, types.Array) and a.ndim == 2 and a.layout == "C" and a.dtype == types.float32
                    for a in (x, xp))):
            return None

        def codegen(context, builder, sig, args):
            ptr, i64 = ir.PointerType(ir.IntType(8)), ir.IntType(64)
            xa, pa = linked_arrays(_library, context, builder, sig, args, 0, 1)
            size = builder.mul(builder.extract_value(xa.shape, 0), builder.extract_value(xa.shape, 1))
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64]), name)
            builder.call(fn, [builder.bitcast(xa.data, ptr), builder.bitcast(pa.data, ptr),
                              builder.udiv(size, ir.Constant(i64, 32))])
            return context.get_dummy_value()
        return types.none(x, xp), codegen
    order.__doc__ = doc
    order.__name__ = order.__qualname__ = name.removeprefix("vkspec_")
    return intrinsic(order)


_ROWS = ("x and xp are C-contiguous 2-d float32 arrays of one shape whose rows are whole groups of 32.")
order_x = _ordering("vkspec_order_x", "xp = x with every 32 floats in jit_ir_blocks.group_order's order, the "
                    "order gemv_fused's fused kernels read their input rows in (where ORDERED). " + _ROWS)
order_staged = _ordering("vkspec_order_staged", "xp = x with every 32 floats in jit_ir_blocks.STAGED_ORDER, the "
                         "order the staged kernels read their input rows in (STAGED). " + _ROWS)


def machine_code() -> str:
    """The unpack kernels' assembly (tests read it for fused multiply-adds)."""
    from numba.core.registry import cpu_target
    return _library(cpu_target.target_context).get_asm_str()
