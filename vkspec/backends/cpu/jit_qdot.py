"""qdot's C calls from numba code: ``q8_gemvs(mats, count, x, threads)`` in a
compiled kernel is vk_q8_gemvs of the library qdot chooses (its Python
twin is qdot.gemvs), with no Python between it and the kernel's other steps.

Why: a sublayer's GEMVs, norms, activations and attention as one compiled
call (jit_sublayer) cost one dispatch from Python instead of a dozen, and a
decoding step at real widths runs its Python with cold caches.

How: the compiled code calls through a cell of two function pointers, an
LLVM symbol of this process (llvmlite's add_symbol), so numba's cache on disk
holds code that asks for the cell by name, never an address. ``bind()``
fills the cell with the library qdot.lib() chooses now (VKSPEC_CPU_ISA read
as qdot reads it); callers bind before each call (an unbound cell is null:
nothing binds at import, which would build the library for an f32 run). The library is the same
one qdot's own calls run, so the bits are (tests/test_q8.py holds every
library to the definition).

mats: an int64 array of qdot.Mat rows (qdot.mat_words), whose output
words (Y, Y + 1: address, stride in floats) the caller fills in for each
call (set_output).
"""

from __future__ import annotations

import ctypes

from . import numba_cache  # noqa: F401,I001  (first: where numba caches)
import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import qdot

Y = qdot._Y                                         # a Mat row's output address; Y + 1: its stride
_CELL_NAME = "vkspec_q8_gemvs_cell"
_CELL = (ctypes.c_void_p * 1)()
_BOUND: list = [None]
llvm.add_symbol(_CELL_NAME, ctypes.addressof(_CELL))


def bind() -> None:
    """The cell points at vk_q8_gemvs of the library qdot.lib() chooses."""
    lib = qdot.lib()
    if _BOUND[0] is not lib:
        _CELL[0] = ctypes.cast(lib.vk_q8_gemvs, ctypes.c_void_p).value
        _BOUND[0] = lib


@intrinsic
def _call_cell(typingctx, mats, count, x, n, threads):
    """vk_q8_gemvs(mats, count, x, n, threads) through the cell; its status."""
    if not (isinstance(mats, types.Array) and mats.dtype == types.int64 and mats.layout == "C"
            and isinstance(x, types.Array) and x.dtype == types.float32 and x.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        ptr, i64, i32 = ir.PointerType(ir.IntType(8)), ir.IntType(64), ir.IntType(32)
        fnty = ir.FunctionType(i32, [ptr, i32, ptr, i64, i32])
        cell = builder.module.globals.get(_CELL_NAME)
        if cell is None:
            cell = ir.GlobalVariable(builder.module, ir.PointerType(fnty), _CELL_NAME)
            cell.linkage = "external"
        ma = context.make_array(sig.args[0])(context, builder, args[0])
        xa = context.make_array(sig.args[2])(context, builder, args[2])
        as32 = [builder.trunc(context.cast(builder, args[i], sig.args[i], types.int64), i32) for i in (1, 4)]
        n = context.cast(builder, args[3], sig.args[3], types.int64)
        return builder.call(builder.load(cell), [builder.bitcast(ma.data, ptr), as32[0], builder.bitcast(xa.data, ptr),
                                                 n, as32[1]])
    return types.int32(mats, count, x, n, threads), codegen


@njit(inline="always", boundscheck=False)
def set_output(mats, i, y):
    """Matrix i of mats writes its (n, rows) output into y (C-contiguous)."""
    mats[i, Y] = y.ctypes.data
    mats[i, Y + 1] = y.shape[1]


@njit(inline="always", boundscheck=False)
def q8_gemvs(mats, count, x, threads):
    """qdot.gemvs: every row of x (n, cols) against matrices 0..count-1 of
    mats, into the outputs set_output gave them."""
    if _call_cell(mats, count, x, x.shape[0], threads):
        raise MemoryError("q8 GEMV: out of memory for its buffers")

