"""The block formats' inner loops (jit_ir.unpack_ir) called from numba:
``unpack(KIND, row, at, out, y, d, m, shift)`` decodes the quants at
row[at:] into out[y:] (16 bytes into 32 values, or 32 into 32).

Why: numba compiles a loop over uint8 quants to one scalar int-to-float
conversion a value (LLVM does not vectorise it), ~0.8 ns a value, which made
the block GEMV read 0.7-1.4 GB/s; here a block's values come out of a few
vector instructions. tests/test_formats.py holds the decoders that use these
to formats/ggml.py bit for bit, edge blocks included.

Callers guarantee the bytes and the 32 floats are there (nothing checks).
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit_ir import unpack_ir

Q4_0, Q4_1, Q4_K, Q8_0 = 0, 1, 2, 3
_NAMES = ("vkspec_q4_0", "vkspec_q4_1", "vkspec_q4_k", "vkspec_q8_0")
_LIBRARIES = {}


def _library(context):
    key = id(context.codegen())
    if key not in _LIBRARIES:
        lib = context.codegen().create_library("vkspec_unpack")
        module = llvm.parse_assembly(unpack_ir())
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
        context.active_code_library.add_linking_library(_library(context))
        ptr, f32, i8 = ir.PointerType(ir.IntType(8)), ir.FloatType(), ir.IntType(8)
        ra = context.make_array(sig.args[1])(context, builder, args[1])
        oa = context.make_array(sig.args[3])(context, builder, args[3])
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


def machine_code() -> str:
    """The unpack kernels' assembly (tests read it for fused multiply-adds)."""
    from numba.core.registry import cpu_target
    return _library(cpu_target.target_context).get_asm_str()
