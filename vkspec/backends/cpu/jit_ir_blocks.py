"""LLVM IR for the GEMV over GGUF blocks, generated for an ISA:
vkspec_gemv<n>_<fmt>, n <= MAX_ROWS input rows against every weight row,
with the weight values never written anywhere (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q6_K: what SmolLM2, Llama and Gemma GGUFs hold).

Why: decoding a row into a buffer and then dotting the buffer made the CPU
path read its weights at ~2.5 GB/s in plain decoding. Here each 32 values go
from their bytes into vector registers and straight onto the lanes of every
input row, and a whole block's f16 scales widen in one vector instruction.

Why it is exact: the values are formats/ggml.py's formulas (one fmul, then
one fadd/fsub for a min; no fast-math flags, so never fused) with the same
operands in the same order, and the f16 widening is exact (below). The dot
is exact.dot's: 32 values at column 32 b are lanes 32 (b % 4) .. + 31 of the
128, each lane adds x * w in column order from +0, then exact._finish's
tree. Which vector element holds which lane is free: on AVX-512, a group's
values and the input rows' columns sit in PERM's order, which makes the
tree's first steps whole-vector adds (_finish, group_order).
The lanes may be visited in passes (AVX2 and plain have too few registers
for 128 lanes of several rows): pass p takes the 32-value groups whose
b % 4 it owns, in column order, so no group is decoded twice. A last step
with fewer than 4 groups (32-value formats) leaves the missing lanes alone,
the same as adding the definition's +0 padding (no lane is ever -0).
Past the rows a decoding pass holds in registers (AVX2 past 2, plain past
1) a kernel is staged (_staged_ir): each weight row is decoded once into a
buffer laid out for the finish, then dotted with every input row.

f16: with F16C (AVX2, AVX-512) a scale is widened by ``fpext half`` alone.
That is exact except that it quiets a signalling NaN, which no output shows:
a widened scale only ever enters an fmul, and on x86 an operation returns
its first NaN operand quieted, signalling or not (NaN payloads are outside
the contract anyway: selftest.same_bits). Checking for exponent 31 cost 9
of the 77 instructions of a Q4_1 block pair. tests/test_formats.py's edge
blocks put every special in every f16 field. On the plain ISA the whole
widening is integer operations.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import llvmlite.binding as llvm

from . import jit_ir
from .jit_ir import (ISA, ISAS, MAX_ROWS, QUERY_GROUPS, _consts, _ir, finish, narrow, query_scores_ir,
                     row_values_ir, scores_ir, unpack_ir)


@dataclass(frozen=True)
class Fmt:
    bytes: int                  # of a block
    values: int                 # of a block: 32, or 256 (8 groups of 32)
    f16: tuple[str, ...]        # the block's f16 fields at bytes 0, 2: d, and the min


# every weight format's number in the compiled kernels (jit_blocks.decode_row)
CODES = {name: i for i, name in enumerate(
    ("f32", "f16", "bf16", "int8", "int4-g64", "fp8", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
     "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"))}

FORMATS = {"q4_0": Fmt(18, 32, ("d",)), "q4_1": Fmt(20, 32, ("d", "m")), "q5_0": Fmt(22, 32, ("d",)),
           "q5_1": Fmt(24, 32, ("d", "m")), "q8_0": Fmt(34, 32, ("d",)),
           "q4_k": Fmt(144, 256, ("d", "m")), "q6_k": Fmt(210, 256, ())}
_Q6_D = 208                     # Q6_K keeps its f16 last
# Where a group's 32 values sit in its vectors (group_order): position p
# holds column PERM[p], the columns 4e + k (e = 0..7) for k = 0, 2, 1, 3 in
# turn. Lane 4e + k is accumulator k of exact's lane e, so the finish's first
# two steps, (a0 + a1) and (a2 + a3) then their sum, add positions 0..15 to
# 16..31 and then the two halves: whole vectors, where the column order
# needed two two-source shuffles per pair of vectors of every row. The
# decoders shuffle their bytes into this order (one byte shuffle a group,
# shared by the rows) and vkspec_order_x does the same to the input rows
# once a call.
PERM = tuple(4 * (p % 8) + (0, 2, 1, 3)[p // 8] for p in range(32))
COLUMNS = tuple(range(32))


def group_order(isa: str = ISA) -> tuple[int, ...]:
    """PERM where a group's bytes are permuted by one instruction (AVX-512
    with VBMI's vpermb), the column order elsewhere: AVX2 needs ~4
    instructions a group for it, more than the finish saves at one row
    (haswell code on a Zen 4, Q8_0 lm_head at one row: 2.30 against 2.05 ms)."""
    return PERM if isa == "avx512" and _host_vbmi() else COLUMNS


@functools.cache
def _host_vbmi() -> bool:
    return bool(llvm.get_host_cpu_features().get("avx512vbmi", False))


def _f16_ir(isa: str) -> list[str]:
    L = ["define internal float @vkspec_f16(ptr %p) alwaysinline {", "entry:",
         "  %h16 = load i16, ptr %p, align 1"]
    if isa != "plain":
        return L + ["  %hf = bitcast i16 %h16 to half", "  %f = fpext half %hf to float", "  ret float %f", "}"]
    return L + [
        "  %h = zext i16 %h16 to i32", "  %sg = and i32 %h, 32768", "  %sign = shl i32 %sg, 16",
        "  %man = and i32 %h, 1023", "  %m13 = shl i32 %man, 13", "  %inf0 = or i32 %sign, 2139095040",
        "  %inf = or i32 %inf0, %m13", "  %em = and i32 %h, 31744", "  %isi = icmp eq i32 %em, 31744",
        "  %e = lshr i32 %em, 10", "  %mf = uitofp i32 %man to float",
        "  %sub = fmul float %mf, 0x3E70000000000000",         # man * 2^-24: exact
        "  %subb = bitcast float %sub to i32", "  %subs = or i32 %subb, %sign",
        "  %e112 = add i32 %e, 112", "  %eb = shl i32 %e112, 23", "  %n0 = or i32 %sign, %eb",
        "  %nrm = or i32 %n0, %m13", "  %isz = icmp eq i32 %e, 0",
        "  %fin = select i1 %isz, i32 %subs, i32 %nrm",
        "  %r = select i1 %isi, i32 %inf, i32 %fin", "  %f = bitcast i32 %r to float", "  ret float %f", "}"]


def _halves(g: str, fields: list[tuple[str, str]], isa: str) -> list[str]:
    """Float %{name} for each (name, byte pointer) f16 field, all widened at once."""
    if isa == "plain" or len(fields) == 1:
        return [f"  %{n} = call float @vkspec_f16(ptr {p})" for n, p in fields]
    N = 1 << (len(fields) - 1).bit_length()
    L, prev = [], "poison"
    for k, (n, p) in enumerate(fields):
        L += [f"  %h{n} = load i16, ptr {p}, align 1",
              f"  %hv{g}.{k} = insertelement <{N} x i16> {prev}, i16 %h{n}, i64 {k}"]
        prev = f"%hv{g}.{k}"
    L += [f"  %hh{g} = bitcast <{N} x i16> {prev} to <{N} x half>",
          f"  %rf{g} = fpext <{N} x half> %hh{g} to <{N} x float>"]
    return L + [f"  %{n} = extractelement <{N} x float> %rf{g}, i64 {k}" for k, (n, _) in enumerate(fields)]


def _splat(name: str, value: str, n: int = 32) -> list[str]:
    return jit_ir._splat(name, value, n, "float")


def _byte(name: str, base: str, at: int) -> list[str]:
    """%{name}: the byte at base + at as an i32."""
    return [f"  %{name}p = getelementptr i8, ptr {base}, i64 {at}", f"  %{name}b = load i8, ptr %{name}p, align 1",
            f"  %{name} = zext i8 %{name}b to i32"]


def _nibbles(t: str, at: str, order) -> list[str]:
    """%q{t} <32 x i32>: the low nibbles of 16 bytes, then their high
    nibbles (values 0..15, 16..31), in the given order. In column order the
    bytes are widened first, so each 8 values are one widening load and one
    mask or shift (AVX2's vpmovzxbd from memory) rather than byte masks,
    shuffles and four widenings."""
    if order == COLUMNS:
        return [f"  %v{t} = load <16 x i8>, ptr {at}, align 1", f"  %vw{t} = zext <16 x i8> %v{t} to <16 x i32>",
                f"  %lo{t} = and <16 x i32> %vw{t}, {_consts([15] * 16)}",
                f"  %hi{t} = lshr <16 x i32> %vw{t}, {_consts([4] * 16)}",
                f"  %q{t} = shufflevector <16 x i32> %lo{t}, <16 x i32> %hi{t}, <32 x i32> {_consts(range(32))}"]
    return [f"  %v{t} = load <16 x i8>, ptr {at}, align 1",
            f"  %lo{t} = and <16 x i8> %v{t}, {_consts([15] * 16, 'i8')}",
            f"  %hi{t} = lshr <16 x i8> %v{t}, {_consts([4] * 16, 'i8')}",
            f"  %qb{t} = shufflevector <16 x i8> %lo{t}, <16 x i8> %hi{t}, <32 x i32> {_consts(order)}",
            f"  %q{t} = zext <32 x i8> %qb{t} to <32 x i32>"]


def _order(name: str, v: str, order) -> str:
    """A group's 32 bytes, in column order, put in the given order."""
    return f"  {name} = shufflevector <32 x i8> {v}, <32 x i8> poison, <32 x i32> {_consts(order)}"


def _group(fmt: str, t: str, unit: str, j: int, order) -> list[str]:
    """%w{t} <32 x float>: the values of 32-value group j of the unit at byte
    pointer `unit` (block j of four, or group j of a K-quant block), whose
    f16 fields _unit_scales has widened, in the given order (group_order)."""
    f = FORMATS[fmt]
    if f.values == 32:
        at, d = f"%at{t}", f"%{t}.d"
        L = [f"  {at} = getelementptr i8, ptr {unit}, i64 {j * f.bytes}"] + _splat(f"ds{t}", f"{d}")
        if fmt == "q8_0":                                               # q * d
            return L + [f"  %qp{t} = getelementptr i8, ptr {at}, i64 2", f"  %v{t} = load <32 x i8>, ptr %qp{t}, align 1",
                        _order(f"%vo{t}", f"%v{t}", order), f"  %qf{t} = sitofp <32 x i8> %vo{t} to <32 x float>",
                        f"  %w{t} = fmul <32 x float> %qf{t}, %ds{t}"]
        qs = {"q4_0": 2, "q4_1": 4, "q5_0": 6, "q5_1": 8}[fmt]
        L += [f"  %qp{t} = getelementptr i8, ptr {at}, i64 {qs}"] + _nibbles(t, f"%qp{t}", order)
        q = f"%q{t}"
        if fmt in ("q5_0", "q5_1"):                                     # bit j of qh is value j's fifth
            L += [f"  %hp{t} = getelementptr i8, ptr {at}, i64 {qs - 4}", f"  %h{t} = load i32, ptr %hp{t}, align 1",
                  f"  %h1{t} = insertelement <32 x i32> poison, i32 %h{t}, i64 0",
                  f"  %hs{t} = shufflevector <32 x i32> %h1{t}, <32 x i32> poison, <32 x i32> zeroinitializer",
                  f"  %hb{t} = lshr <32 x i32> %hs{t}, {_consts(order)}",
                  f"  %h5{t} = and <32 x i32> %hb{t}, {_consts([1] * 32)}",
                  f"  %h4{t} = shl <32 x i32> %h5{t}, {_consts([4] * 32)}", f"  %q5{t} = or <32 x i32> %q{t}, %h4{t}"]
            q = f"%q5{t}"
        if fmt in ("q4_0", "q5_0"):                                     # d * (q - 8 or 16)
            return L + [f"  %qs{t} = sub <32 x i32> {q}, {_consts([8 if fmt == 'q4_0' else 16] * 32)}",
                        f"  %qf{t} = sitofp <32 x i32> %qs{t} to <32 x float>",
                        f"  %w{t} = fmul <32 x float> %ds{t}, %qf{t}"]
        return L + _splat(f"ms{t}", f"%{t}.m") + [                       # d * q + m
            f"  %qf{t} = uitofp <32 x i32> {q} to <32 x float>", f"  %pr{t} = fmul <32 x float> %ds{t}, %qf{t}",
            f"  %w{t} = fadd <32 x float> %pr{t}, %ms{t}"]
    u = unit[1:]
    if fmt == "q4_k":             # (d * sc) * q - (dmin * mn), 6-bit (sc, mn) pairs packed in 12 bytes
        if j < 4:
            L = _byte(f"sa{t}", unit, 4 + j) + _byte(f"ma{t}", unit, 8 + j)
            L += [f"  %sc{t} = and i32 %sa{t}, 63", f"  %mn{t} = and i32 %ma{t}, 63"]
        else:
            L = _byte(f"sa{t}", unit, 8 + j) + _byte(f"sb{t}", unit, j) + _byte(f"mb{t}", unit, 4 + j)
            L += [f"  %sl{t} = and i32 %sa{t}, 15", f"  %sh{t} = lshr i32 %sb{t}, 6", f"  %sh4{t} = shl i32 %sh{t}, 4",
                  f"  %sc{t} = or i32 %sl{t}, %sh4{t}", f"  %ml{t} = lshr i32 %sa{t}, 4",
                  f"  %mh{t} = lshr i32 %mb{t}, 6", f"  %mh4{t} = shl i32 %mh{t}, 4", f"  %mn{t} = or i32 %ml{t}, %mh4{t}"]
        L += [f"  %scf{t} = uitofp i32 %sc{t} to float", f"  %mnf{t} = uitofp i32 %mn{t} to float",
              f"  %dsc{t} = fmul float %{u}.d, %scf{t}", f"  %dmn{t} = fmul float %{u}.m, %mnf{t}"]
        L += _splat(f"ds{t}", f"%dsc{t}") + _splat(f"ms{t}", f"%dmn{t}")
        return L + [f"  %qp{t} = getelementptr i8, ptr {unit}, i64 {16 + 32 * (j // 2)}",
                    f"  %v{t} = load <32 x i8>, ptr %qp{t}, align 1", _order(f"%vo{t}", f"%v{t}", order),
                    f"  %s{t} = lshr <32 x i8> %vo{t}, {_consts([4 * (j % 2)] * 32, 'i8')}",
                    f"  %q{t} = and <32 x i8> %s{t}, {_consts([15] * 32, 'i8')}",
                    f"  %qf{t} = uitofp <32 x i8> %q{t} to <32 x float>", f"  %pr{t} = fmul <32 x float> %ds{t}, %qf{t}",
                    f"  %w{t} = fsub <32 x float> %pr{t}, %ms{t}"]
    half, k = j // 4, j % 4        # q6_k: (d * sc) * (q - 32), an int8 scale per 16 values
    L = []
    for g in range(2):
        L += _byte(f"c{g}{t}", unit, 192 + 8 * half + 2 * k + g)
        L += [f"  %c{g}s{t} = trunc i32 %c{g}{t} to i8", f"  %c{g}f{t} = sitofp i8 %c{g}s{t} to float",
              f"  %dl{g}{t} = fmul float %{u}.d, %c{g}f{t}"] + _splat(f"dl{g}s{t}", f"%dl{g}{t}")
    L += [f"  %ds{t} = shufflevector <32 x float> %dl0s{t}, <32 x float> %dl1s{t}, "
          f"<32 x i32> {_consts([0 if c < 16 else 32 for c in order])}",
          f"  %lp{t} = getelementptr i8, ptr {unit}, i64 {64 * half + 32 * (k % 2)}",
          f"  %hp{t} = getelementptr i8, ptr {unit}, i64 {128 + 32 * half}",
          f"  %lv{t} = load <32 x i8>, ptr %lp{t}, align 1", f"  %hv{t} = load <32 x i8>, ptr %hp{t}, align 1",
          f"  %ls{t} = lshr <32 x i8> %lv{t}, {_consts([4 * (k // 2)] * 32, 'i8')}",
          f"  %lq{t} = and <32 x i8> %ls{t}, {_consts([15] * 32, 'i8')}",
          f"  %hs{t} = lshr <32 x i8> %hv{t}, {_consts([2 * k] * 32, 'i8')}",
          f"  %hq{t} = and <32 x i8> %hs{t}, {_consts([3] * 32, 'i8')}",
          f"  %h4{t} = shl <32 x i8> %hq{t}, {_consts([4] * 32, 'i8')}", f"  %qb{t} = or <32 x i8> %lq{t}, %h4{t}",
          _order(f"%qo{t}", f"%qb{t}", order), f"  %q{t} = zext <32 x i8> %qo{t} to <32 x i32>",
          f"  %qs{t} = sub <32 x i32> %q{t}, {_consts([32] * 32)}",
          f"  %qf{t} = sitofp <32 x i32> %qs{t} to <32 x float>", f"  %w{t} = fmul <32 x float> %ds{t}, %qf{t}"]
    return L


def _paired_scales(g: str, unit: str, groups: list[tuple[str, int]], f: Fmt) -> list[str]:
    """_unit_scales of a format with d and m side by side (Q4_1, Q5_1): each
    block's pair is one 32-bit load, so a unit's four pairs are four inserts
    into the vector of halves instead of eight 16-bit ones."""
    N = 1 << (2 * len(groups) - 1).bit_length()
    L, prev = [], "poison"
    for k, (t, j) in enumerate(groups):
        L += [f"  %{t}.pp = getelementptr i8, ptr {unit}, i64 {j * f.bytes}",
              f"  %{t}.pr = load i32, ptr %{t}.pp, align 1",
              f"  %pv{g}.{k} = insertelement <{N // 2} x i32> {prev}, i32 %{t}.pr, i64 {k}"]
        prev = f"%pv{g}.{k}"
    L += [f"  %hh{g} = bitcast <{N // 2} x i32> {prev} to <{N} x half>",
          f"  %rf{g} = fpext <{N} x half> %hh{g} to <{N} x float>"]
    return L + [f"  %{t}.{s} = extractelement <{N} x float> %rf{g}, i64 {2 * k + i}"
                for k, (t, _) in enumerate(groups) for i, s in enumerate(f.f16)]


def _unit_scales(fmt: str, g: str, unit: str, groups: list[tuple[str, int]], isa: str) -> list[str]:
    """The f16 fields the groups [(t, j)] of a unit read: %{t}.d (.m) per
    block of a 32-value format, %{unit}.d (.m) of a K-quant block."""
    f = FORMATS[fmt]
    if f.values == 32 and len(f.f16) == 2 and len(groups) > 1 and isa != "plain":
        return _paired_scales(g, unit, groups, f)
    if f.values == 32:
        fields = [(f"{t}.{s}", f"%{t}.{s}p") for t, _ in groups for s in f.f16]
        L = [f"  %{t}.{s}p = getelementptr i8, ptr {unit}, i64 {j * f.bytes + 2 * i}"
             for t, j in groups for i, s in enumerate(f.f16)]
        return L + _halves(g, fields, isa)
    u = unit[1:]
    names = f.f16 if fmt == "q4_k" else ("d",)
    offsets = (0, 2) if fmt == "q4_k" else (_Q6_D,)
    L = [f"  %{u}.{s}p = getelementptr i8, ptr {unit}, i64 {o}" for s, o in zip(names, offsets)]
    return L + _halves(g, [(f"{u}.{s}", f"%{u}.{s}p") for s in names], isa)


# rows a staged kernel's pass takes at most: 4 vectors of 8 floats each, with
# one weight vector and a product beside them (AVX2: 3 rows, 14 of 16 ymm;
# plain SSE halves the vectors, so 1). A pass of 3 rows loads the weight
# vector once for 3 products instead of 2: the 6-row GEMVs of a SmolLM2
# forward 26.9 -> 25.0 ms with the byte-shuffle decode (_staged_group).
STAGED_ROWS = {"avx512": 2, "avx2": 3, "plain": 1}
# the staged kernels' order of a group's 32 values: vector k (positions 8k..)
# holds columns 4 STAGED_E[i] + k, i = 0..7 (_transposed)
STAGED_E = (0, 2, 4, 6, 1, 3, 5, 7)
STAGED_ORDER = tuple(4 * STAGED_E[p % 8] + p // 8 for p in range(32))


def staged(n: int, isa: str = ISA) -> bool:
    """Whether the n-row block GEMV is staged (_staged_ir), reading its input
    rows through order_staged."""
    return not fused_passes(n, isa)


def fused_passes(n: int, isa: str = ISA) -> int:
    """Lane passes of an n-row block GEMV that decodes onto the lanes: the
    fewest (1, 2 or 4) whose accumulators fit the ISA's register budget; 0
    where none does (the kernel is staged: _staged_ir)."""
    V, budget = ISAS[isa]
    return next((p for p in (1, 2, 4) if n * (32 // V) * (4 // p) <= budget), 0)


def _gemv_ir(fmt: str, n: int, isa: str) -> list[str]:
    """vkspec_gemv<n>_<fmt>(w, row_stride, x, x_stride, out, out_stride, rows, groups):
    out[r * out_stride + m] = dot(x[r * x_stride:][:32 groups], row m's
    values) for r < n, m < rows. A loop step is a unit: 4 blocks of 32, or
    one K-quant block (8 groups, two turns of the lanes)."""
    f, V, R, order = FORMATS[fmt], ISAS[isa][0], range(n), group_order(isa)
    P, T, S = fused_passes(n, isa), f"<{V} x float>", 32 // V       # S: vectors per group
    if not P:
        return _staged_ir(fmt, n, isa)
    per = 4 if f.values == 32 else 8                                  # groups per unit
    ubytes = 4 * f.bytes if f.values == 32 else f.bytes
    L = [f"define void @vkspec_gemv{n}_{fmt}(ptr %w, i64 %rs, ptr %x, i64 %xs, ptr %out, i64 %os, "
         "i64 %rows, i64 %ng) {", "entry:", f"  %buf = alloca [{128 * n} x float], align 64",
         f"  %full = udiv i64 %ng, {per}", f"  %restg = urem i64 %ng, {per}", f"  %tb = mul i64 %full, {ubytes}"]
    L += [line for r in R for line in (f"  %xr{r} = mul i64 %xs, {r}", f"  %x{r} = getelementptr float, ptr %x, i64 %xr{r}")]
    L += ["  %norows = icmp eq i64 %rows, 0", "  br i1 %norows, label %done, label %row", "row:",
          "  %m = phi i64 [0, %entry], [%mn, %finish]", "  %wo = mul i64 %m, %rs",
          "  %wrow = getelementptr i8, ptr %w, i64 %wo", "  br label %loop0"]

    def accumulate(g, unit, col0, groups, acc, new):
        """groups [(t, j)] of the unit at `unit` (its first column col0) onto
        the lanes of j % 4, every row."""
        out = _unit_scales(fmt, g, unit, groups, isa)
        for t, j in groups:
            out += _group(fmt, t, unit, j, order) + [f"  %xo{t} = add i64 {col0}, {32 * j}"]
            for i in range(S):
                out += [f"  %wv{t}.{i} = shufflevector <32 x float> %w{t}, <32 x float> poison, "
                        f"<{V} x i32> {_consts(range(V * i, V * i + V))}", f"  %xi{t}.{i} = add i64 %xo{t}, {V * i}"]
                for r in R:
                    lane = f"{j % 4}.{i}.{r}"
                    out += [f"  %xp{t}.{i}.{r} = getelementptr float, ptr %x{r}, i64 %xi{t}.{i}",
                            f"  %xv{t}.{i}.{r} = load {T}, ptr %xp{t}.{i}.{r}, align 4",
                            f"  %pp{t}.{i}.{r} = fmul {T} %xv{t}.{i}.{r}, %wv{t}.{i}",
                            f"  {new(t, j, lane)} = fadd {T} {acc(t, j, lane)}, %pp{t}.{i}.{r}"]
        return out

    for p in range(P):
        offs = range(p * 4 // P, (p + 1) * 4 // P)                    # lane groups (b % 4) this pass owns
        mine = [j for j in range(per) if j % 4 in offs]                # in column order
        lanes = [f"{o}.{i}.{r}" for o in offs for i in range(S) for r in R]
        prev = "row" if p == 0 else f"park{p - 1}"
        step_last = {j % 4: j for j in mine}                          # the last group to touch each lane group

        def cur(t, j, lane, p=p):                                       # the lane's value before group j
            first = min(jj for jj in mine if jj % 4 == j % 4)
            return f"%a{p}.{lane}" if j == first else f"%s{p}.{j - 4}.{lane}"

        L += [f"loop{p}:", f"  %c{p} = phi i64 [0, %{prev}], [%cn{p}, %step{p}]"]
        L += [f"  %a{p}.{ln} = phi {T} [zeroinitializer, %{prev}], [%s{p}.{step_last[int(ln.split('.')[0])]}.{ln}, "
              f"%step{p}]" for ln in lanes]
        L += [f"  %stop{p} = icmp eq i64 %c{p}, %full", f"  br i1 %stop{p}, label %tail{p}, label %step{p}",
              f"step{p}:", f"  %ub{p} = mul i64 %c{p}, {ubytes}", f"  %u{p} = getelementptr i8, ptr %wrow, i64 %ub{p}",
              f"  %col{p} = mul i64 %c{p}, {32 * per}"]
        L += accumulate(f"s{p}", f"%u{p}", f"%col{p}", [(f"s{p}.{j}", j) for j in mine], cur,
                        lambda t, j, lane, p=p: f"%s{p}.{j}.{lane}")
        L += [f"  %cn{p} = add i64 %c{p}, 1", f"  br label %loop{p}", f"tail{p}:"]
        if f.values == 32:                                             # the last, partial step
            L += [f"  %tu{p} = getelementptr i8, ptr %wrow, i64 %tb", f"  %tcol{p} = mul i64 %full, 128"]
            for k, j in enumerate(offs):
                nxt = f"tail{p}.{offs[k + 1]}" if k + 1 < len(offs) else f"park{p}"
                here = f"tail{p}" if k == 0 else f"tail{p}.{j}"
                if k:
                    L.append(f"{here}:")
                L += [f"  %live{p}.{j} = icmp ult i64 {j}, %restg",
                      f"  br i1 %live{p}.{j}, label %do{p}.{j}, label %join{p}.{j}", f"do{p}.{j}:"]
                L += accumulate(f"t{p}.{j}", f"%tu{p}", f"%tcol{p}", [(f"t{p}.{j}", j)],
                                lambda t, jj, lane, p=p: f"%a{p}.{lane}", lambda t, jj, lane: f"%n{t}.{lane}")
                L += [f"  br label %join{p}.{j}", f"join{p}.{j}:"]
                L += [f"  %g{p}.{j}.{i}.{r} = phi {T} [%a{p}.{j}.{i}.{r}, %{here}], [%nt{p}.{j}.{j}.{i}.{r}, %do{p}.{j}]"
                      for i in range(S) for r in R]
                L.append(f"  br label %{nxt}")
        else:
            L += [f"  %g{p}.{ln} = bitcast {T} %a{p}.{ln} to {T}" for ln in lanes] + [f"  br label %park{p}"]
        L.append(f"park{p}:")
        for o in offs:
            for i in range(S):
                for r in R:
                    L += [f"  %pk{p}.{o}.{i}.{r} = getelementptr float, ptr %buf, i64 {128 * r + 32 * o + V * i}",
                          f"  store {T} %g{p}.{o}.{i}.{r}, ptr %pk{p}.{o}.{i}.{r}, align 4"]
        L.append(f"  br label %{'loop' + str(p + 1) if p + 1 < P else 'finish'}")
    L.append("finish:")
    for r in R:
        L += [f"  %oi{r} = mul i64 %os, {r}", f"  %om{r} = add i64 %oi{r}, %m"]
        L += _finish(r, 128 * r, f"%om{r}") if order == PERM else finish(r, f"{128 * r}", f"%om{r}")
    return L + ["  %mn = add i64 %m, 1", "  %last = icmp eq i64 %mn, %rows",
                "  br i1 %last, label %done, label %row", "done:", "  ret void", "}"]


def _staged_ir(fmt: str, n: int, isa: str) -> list[str]:
    """vkspec_gemv<n>_<fmt> where a decoding pass cannot hold the n rows'
    lanes in registers (AVX2 past 2 rows, plain past 1): a call of the
    format's one staged kernel (_staged_kernel_ir), which takes the row
    count as an argument (one copy of its code serves 3 to 8 rows: each
    compiled kernel links its own copy of this library)."""
    return [f"define void @vkspec_gemv{n}_{fmt}(ptr %w, i64 %rs, ptr %x, i64 %xs, ptr %out, i64 %os, "
            "i64 %rows, i64 %ng) {", "entry:",
            f"  call void @vkspec_staged_{fmt}(ptr %w, i64 %rs, ptr %x, i64 %xs, ptr %out, i64 %os, i64 %rows, "
            f"i64 %ng, i64 {n})", "  ret void", "}"]


def _staged_kernel_ir(fmt: str, isa: str) -> list[str]:
    """vkspec_staged_<fmt>(w, row_stride, x, x_stride, out, out_stride,
    rows, groups, n): vkspec_gemv<n>_<fmt>'s result for any n >= 1.

    Each weight row is decoded whole into a stack buffer (its scales widened
    once), every group of 32 values transposed (_transposed) so that vector
    k of a group holds accumulator k of 8 of exact's lanes: the finish's
    (a0 + a1) + (a2 + a3), then s[i] + s[i + 16] and s[i] + s[i + 8], are
    adds of whole 8-float vectors, and only the last three steps move
    values across a vector. order_staged puts the input rows' groups in the
    same order, so every lane adds the same products in column order.

    A pass takes group o (of the four a 128-column step holds) of every
    step for a set of input rows, 4 vectors a row, in registers, and parks
    each row's 8 sums t[8o..8o+7]. The sets are STAGED_ROWS rows, or fewer
    where that would leave one row alone (4 = 2 + 2, 7 = 3 + 2 + 2): a
    lone row's pass loads two vectors a product.
    Columns are whole groups (a block format), so there is no partial step:
    a group past the last keeps +0, the definition's padding.

    Why: the 4-row dot over a column-order buffer (jit_ir._ir) ran 8 lane
    passes of 16 lanes, each with its own loop and tail, then parked all
    512 lane sums and read them back for a tree of shuffles (on a Zen 3,
    3 to 8 verify rows of SmolLM2: T(6)/T(1) 3.0 -> 2.4)."""
    f, V, RP = FORMATS[fmt], 8, STAGED_ROWS[isa]
    sets = tuple(range(RP, 0, -1))
    T = f"<{V} x float>"
    per = 4 if f.values == 32 else 8                                  # groups per unit
    ubytes = 4 * f.bytes if f.values == 32 else f.bytes
    L = [f"define internal void @vkspec_staged_{fmt}(ptr %w, i64 %rs, ptr %x, i64 %xs, ptr %out, i64 %os, "
         "i64 %rows, i64 %ng, i64 %n) noinline {", "entry:", "  %cols = shl i64 %ng, 5",
         "  %wb = alloca float, i64 %cols, align 64", "  %nt = shl i64 %n, 2", f"  %tb = alloca {T}, i64 %nt, align 64",
         f"  %full = udiv i64 %ng, {per}", f"  %restg = urem i64 %ng, {per}", f"  %tb0 = mul i64 %full, {ubytes}"]
    for o in range(4):
        L += [f"  %ng{o} = add i64 %ng, {3 - o}", f"  %steps{o} = lshr i64 %ng{o}, 2"]
    L += ["  %norows = icmp eq i64 %rows, 0", "  br i1 %norows, label %done, label %row", "row:",
          "  %m = phi i64 [0, %entry], [%mn, %next]",
          "  %wo = mul i64 %m, %rs", "  %wrow = getelementptr i8, ptr %w, i64 %wo", "  br label %loop", "loop:",
          "  %c = phi i64 [0, %row], [%cn, %step]", "  %stop = icmp eq i64 %c, %full",
          "  br i1 %stop, label %tail, label %step", "step:", f"  %ub = mul i64 %c, {ubytes}",
          "  %u = getelementptr i8, ptr %wrow, i64 %ub", f"  %col = mul i64 %c, {32 * per}"]

    def decoded(unit, col, groups, g):
        out = _unit_scales(fmt, g, unit, groups, isa)
        for t, j in groups:
            out += _staged_group(fmt, t, unit, j) if fmt in SHUFFLED else \
                _group(fmt, t, unit, j, COLUMNS) + _transposed(t)
            out += [f"  %wo{t} = add i64 {col}, {32 * j}"]
            for k in range(4):
                out += [f"  %wq{t}.{k} = add i64 %wo{t}, {8 * k}", f"  %wp{t}.{k} = getelementptr float, ptr %wb, i64 %wq{t}.{k}",
                        f"  store <8 x float> %y{t}.{k}, ptr %wp{t}.{k}, align 4"]
        return out

    L += decoded("%u", "%col", [(f"z{j}", j) for j in range(per)], "zs") + ["  %cn = add i64 %c, 1",
                                                                             "  br label %loop", "tail:"]
    if f.values == 32:                                                 # the last, partial unit's groups
        L += ["  %tu = getelementptr i8, ptr %wrow, i64 %tb0", "  %tcol = mul i64 %full, 128"]
        for j in range(per - 1):
            L += [f"  %live{j} = icmp ult i64 {j}, %restg", f"  br i1 %live{j}, label %do{j}, label %set", f"do{j}:"]
            L += decoded("%tu", "%tcol", [(f"y{j}", j)], f"ys{j}")
    froms = ["tail"] + [f"do{j}" for j in range(per - 1) if f.values == 32]
    L += ["  br label %set", "set:", "  %r0 = phi i64 " + ", ".join(f"[0, %{b}]" for b in froms)
          + "".join(f", [%rn{k}, %p{k}.3.end]" for k in sets), f"  %left = sub i64 %n, %r0"]
    for k in sets[:-1]:                         # k rows, if they fill and leave no lone row
        L += [f"  br label %pick{k}", f"pick{k}:", f"  %fill{k} = icmp uge i64 %left, {k}",
              f"  %lone{k} = icmp ne i64 %left, {k + 1}", f"  %take{k} = and i1 %fill{k}, %lone{k}",
              f"  br i1 %take{k}, label %set{k}, label %next{k}", f"next{k}:"]
    L.append("  br label %set1")
    for k in sets:
        L += [f"set{k}:"] + [f"  %xo{k}.{i} = add i64 %r0, {i}" for i in range(k)]
        for i in range(k):
            L += [f"  %xm{k}.{i} = mul i64 %xs, %xo{k}.{i}", f"  %x{k}.{i} = getelementptr float, ptr %x, i64 %xm{k}.{i}"]
        L.append(f"  br label %p{k}.0")
        for o in range(4):
            tag = f"{k}.{o}"
            acc = [(i, j) for i in range(k) for j in range(4)]
            L += [f"p{tag}:", f"  br label %l{tag}", f"l{tag}:", f"  %c{tag} = phi i64 [0, %p{tag}], [%cn{tag}, %b{tag}]"]
            L += [f"  %a{tag}.{i}.{j} = phi {T} [zeroinitializer, %p{tag}], [%n{tag}.{i}.{j}, %b{tag}]" for i, j in acc]
            L += [f"  %more{tag} = icmp ult i64 %c{tag}, %steps{o}", f"  br i1 %more{tag}, label %b{tag}, label %p{tag}.end",
                  f"b{tag}:", f"  %s7{tag} = shl i64 %c{tag}, 7", f"  %off{tag} = add i64 %s7{tag}, {32 * o}"]
            for j in range(4):
                at = f"%o{tag}.{j}"
                L += [f"  {at} = add i64 %off{tag}, {V * j}", f"  %wp{tag}.{j} = getelementptr float, ptr %wb, i64 {at}",
                      f"  %wv{tag}.{j} = load {T}, ptr %wp{tag}.{j}, align 4"]
                for i in range(k):
                    v = f"{tag}.{i}.{j}"
                    L += [f"  %xp{v} = getelementptr float, ptr %x{k}.{i}, i64 {at}",
                          f"  %xv{v} = load {T}, ptr %xp{v}, align 4",
                          f"  %pr{v} = fmul {T} %xv{v}, %wv{tag}.{j}", f"  %n{v} = fadd {T} %a{v}, %pr{v}"]
            L += [f"  %cn{tag} = add i64 %c{tag}, 1", f"  br label %l{tag}", f"p{tag}.end:"]
            for i in range(k):                  # (k0 + k1) + (k2 + k3) of 8 lanes at once
                v = f"{tag}.{i}"
                L += [f"  %e{v} = fadd {T} %a{v}.0, %a{v}.1", f"  %g{v} = fadd {T} %a{v}.2, %a{v}.3",
                      f"  %t{v} = fadd {T} %e{v}, %g{v}", f"  %ti{v} = shl i64 %xo{k}.{i}, 2",
                      f"  %tj{v} = add i64 %ti{v}, {o}", f"  %tp{v} = getelementptr {T}, ptr %tb, i64 %tj{v}",
                      f"  store {T} %t{v}, ptr %tp{v}, align 32"]
            if o < 3:
                L.append(f"  br label %p{k}.{o + 1}")
        L += [f"  %rn{k} = add i64 %r0, {k}", f"  %sets{k} = icmp ult i64 %rn{k}, %n",
              f"  br i1 %sets{k}, label %set, label %emit"]
    L += ["emit:", "  br label %er", "er:", "  %r = phi i64 [0, %emit], [%rnext, %er]", "  %tr = shl i64 %r, 2"]
    t = [f"%tv.{o}" for o in range(4)]                # s[i] = t[i] + t[i + 16], then s[i] + s[i + 8]: vectors
    for o in range(4):
        L += [f"  %tk.{o} = add i64 %tr, {o}", f"  %tq.{o} = getelementptr {T}, ptr %tb, i64 %tk.{o}",
              f"  {t[o]} = load {T}, ptr %tq.{o}, align 32"]
    L += [f"  %sl = fadd {T} {t[0]}, {t[2]}", f"  %sh = fadd {T} {t[1]}, {t[3]}", f"  %s.8 = fadd {T} %sl, %sh",
          "  %oi = mul i64 %os, %r", "  %om = add i64 %oi, %m",
          f"  %lo.4 = shufflevector {T} %s.8, {T} poison, <4 x i32> {_consts(STAGED_E.index(e) for e in range(4))}",
          f"  %hi.4 = shufflevector {T} %s.8, {T} poison, <4 x i32> {_consts(STAGED_E.index(e) for e in range(4, 8))}",
          "  %s.4 = fadd <4 x float> %lo.4, %hi.4"] + narrow("", "%om", 4)
    return L + ["  %rnext = add i64 %r, 1", "  %rows_done = icmp eq i64 %rnext, %n",
                "  br i1 %rows_done, label %next, label %er", "next:",
                "  %mn = add i64 %m, 1", "  %end = icmp eq i64 %mn, %rows",
                "  br i1 %end, label %done, label %row", "done:", "  ret void", "}"]


SHUFFLED = ("q4_0", "q4_1", "q8_0")


def _staged_group(fmt: str, t: str, unit: str, j: int) -> list[str]:
    """%y{t}.k (k < 4) <8 x float>: _transposed's vectors of block j, each
    made from its own bytes by one byte shuffle (AVX2's vpshufb) that puts
    value i's byte into dword i, instead of widening the block in column
    order and transposing it (8 two-source shuffles a block, which with the
    widening loads kept the decode on AVX2's two shuffle pipes).
    A 4-bit value stays where its byte puts it: a high nibble is read as
    16 q and its lane's d is d / 16, the same product d * q to the bit (a
    power of two scales exactly: f16 values cannot leave float's normal
    range). Q8_0's byte goes to the top of its dword, q 2^24, times d 2^-24.
    A 4-bit block's 16 bytes are loaded twice, as volatile loads, one for
    each 128-bit half: from one load LLVM builds each vector with a 128-bit
    vpshufb and a vpermq, two shuffles where one does.
    The decode of a Q4_1 row (llvm-mca, znver3): 57 -> 52 cycles a 128
    columns, 40 with _paired_scales; with 3-row passes, the 3- to 8-row
    GEMVs of a SmolLM2 forward 6-11% faster (tests/bench/forward_parts.py)."""
    f, T, at = FORMATS[fmt], "<8 x float>", f"%at{t}"
    L = [f"  {at} = getelementptr i8, ptr {unit}, i64 {j * f.bytes}"]
    E = STAGED_E
    if fmt == "q8_0":
        L += [f"  %qp{t} = getelementptr i8, ptr {at}, i64 2", f"  %v{t} = load <32 x i8>, ptr %qp{t}, align 1",
              f"  %d24{t} = fmul float %{t}.d, 0x3E70000000000000"] + _splat(f"dv{t}", f"%d24{t}", 8)
        L += [f"  %vd{t} = bitcast <32 x i8> %v{t} to <8 x i32>",       # dwords of E's order, each half its own
              f"  %vp{t} = shufflevector <8 x i32> %vd{t}, <8 x i32> poison, <8 x i32> {_consts(E)}",
              f"  %vb{t} = bitcast <8 x i32> %vp{t} to <32 x i8>"]
        for k in range(4):
            L += [_in_halves(f"%b{t}.{k}", f"%vb{t}", [(None, None, None, 4 * (i % 4) + k) for i in range(8)]),
                  f"  %i{t}.{k} = bitcast <32 x i8> %b{t}.{k} to <8 x i32>",
                  f"  %f{t}.{k} = sitofp <8 x i32> %i{t}.{k} to {T}",
                  f"  %y{t}.{k} = fmul {T} %f{t}.{k}, %dv{t}"]
        return L
    qs = {"q4_0": 2, "q4_1": 4}[fmt]
    high = [E[i] >= 4 for i in range(8)]
    L += [f"  %qp{t} = getelementptr i8, ptr {at}, i64 {qs}", f"  %v{t} = load volatile <16 x i8>, ptr %qp{t}, align 1",
          f"  %vh{t} = load volatile <16 x i8>, ptr %qp{t}, align 1",
          f"  %vv{t} = shufflevector <16 x i8> %v{t}, <16 x i8> %vh{t}, <32 x i32> {_consts(range(32))}"]
    L += _splat(f"dv0{t}", f"%{t}.d", 8) + [
          f"  %dv{t} = fmul {T} %dv0{t}, <" + ", ".join(f"float {'0x3FB0000000000000' if h else '1.0'}" for h in high) + ">"]
    if fmt == "q4_1":
        L += _splat(f"mv{t}", f"%{t}.m", 8)
    for k in range(4):
        L += [_in_halves(f"%b{t}.{k}", f"%vv{t}", [(4 * (E[i] % 4) + k, None, None, None) for i in range(8)]),
              f"  %i{t}.{k} = bitcast <32 x i8> %b{t}.{k} to <8 x i32>",
              f"  %n{t}.{k} = and <8 x i32> %i{t}.{k}, {_consts([240 if h else 15 for h in high])}"]
        q = f"%n{t}.{k}"
        if fmt == "q4_0":
            L += [f"  %s{t}.{k} = sub <8 x i32> {q}, {_consts([128 if h else 8 for h in high])}"]
            q = f"%s{t}.{k}"
        prod = f"%p{t}.{k}" if fmt == "q4_1" else f"%y{t}.{k}"
        L += [f"  %f{t}.{k} = sitofp <8 x i32> {q} to {T}", f"  {prod} = fmul {T} %dv{t}, %f{t}.{k}"]
        L += [f"  %y{t}.{k} = fadd {T} %p{t}.{k}, %mv{t}"] if fmt == "q4_1" else []
    return L


def _in_halves(name: str, v: str, dwords) -> str:
    """name <32 x i8>: dword i's 4 bytes, each a byte of the 128-bit half of
    v that holds dword i, by its index in that half (None: zero): AVX2's
    vpshufb."""
    mask = [32 if b is None else 16 * (i // 4) + b for i, dw in enumerate(dwords) for b in dw]
    return f"  {name} = shufflevector <32 x i8> {v}, <32 x i8> zeroinitializer, <32 x i32> {_consts(mask)}"


def _transposed(t: str) -> list[str]:
    """%y{t}.k (k < 4) <8 x float>: the columns 4 STAGED_E[i] + k of the
    group %w{t} <32 x float> (column order), i = 0..7: two rounds of
    two-source shuffles inside 128-bit halves (unpcklps, unpckhps, then
    their 64-bit halves), the 4x4 transposes AVX2 does in 8 instructions."""
    T, half = "<8 x float>", lambda a, b, m: f"shufflevector <8 x float> {a}, <8 x float> {b}, <8 x i32> {_consts(m)}"
    L = [f"  %q{t}.{i} = shufflevector <32 x float> %w{t}, <32 x float> poison, <8 x i32> {_consts(range(8 * i, 8 * i + 8))}"
         for i in range(4)]
    lo, hi = (0, 8, 1, 9, 4, 12, 5, 13), (2, 10, 3, 11, 6, 14, 7, 15)
    L += [f"  %pl{t}.{i} = {half(f'%q{t}.{2 * i}', f'%q{t}.{2 * i + 1}', lo)}" for i in range(2)]
    L += [f"  %ph{t}.{i} = {half(f'%q{t}.{2 * i}', f'%q{t}.{2 * i + 1}', hi)}" for i in range(2)]
    first, second = (0, 1, 8, 9, 4, 5, 12, 13), (2, 3, 10, 11, 6, 7, 14, 15)
    for k, (src, m) in enumerate((("pl", first), ("pl", second), ("ph", first), ("ph", second))):
        L.append(f"  %y{t}.{k} = {half(f'%{src}{t}.0', f'%{src}{t}.1', m)}")
    _ = T
    return L


def _finish(r: int, at: int, index: str) -> list[str]:
    """exact._finish of the 128 lanes parked at %buf[at:], group by group in
    PERM's order (jit_ir.finish: in column order), stored to %out[index]: per group, positions 0..15 plus
    16..31 are [a0 + a1 | a2 + a3] of its 8 lanes and the halves' sum their
    (a0 + a1) + (a2 + a3); the four groups' 8 sums are t[0..31], then
    s[i] = t[i] + t[i + 16] and jit_ir.narrow's steps."""
    F, H, L = "<16 x float>", "<8 x float>", []
    for o in range(4):
        for h in range(2):
            L += [f"  %zp{r}.{o}.{h} = getelementptr float, ptr %buf, i64 {at + 32 * o + 16 * h}",
                  f"  %za{r}.{o}.{h} = load {F}, ptr %zp{r}.{o}.{h}, align 4"]
        L += [f"  %zh{r}.{o} = fadd {F} %za{r}.{o}.0, %za{r}.{o}.1",
              f"  %zl{r}.{o} = shufflevector {F} %zh{r}.{o}, {F} poison, <8 x i32> {_consts(range(8))}",
              f"  %zu{r}.{o} = shufflevector {F} %zh{r}.{o}, {F} poison, <8 x i32> {_consts(range(8, 16))}",
              f"  %zt{r}.{o} = fadd {H} %zl{r}.{o}, %zu{r}.{o}"]
    L += [f"  %zlo{r} = shufflevector {H} %zt{r}.0, {H} %zt{r}.1, <16 x i32> {_consts(range(16))}",
          f"  %zhi{r} = shufflevector {H} %zt{r}.2, {H} %zt{r}.3, <16 x i32> {_consts(range(16))}",
          f"  %s{r}.16 = fadd {F} %zlo{r}, %zhi{r}"]
    return L + narrow(r, index)


def _order_x_ir(name: str, order) -> list[str]:
    """<name>(x, xp, groups): every 32 floats of x (rows of whole groups,
    one after another) into xp in the given order."""
    return [f"define void @{name}(ptr %x, ptr %xp, i64 %groups) {{", "entry:",
            "  %none = icmp eq i64 %groups, 0", "  br i1 %none, label %done, label %loop", "loop:",
            "  %g = phi i64 [0, %entry], [%gn, %loop]", "  %o = mul i64 %g, 32",
            "  %src = getelementptr float, ptr %x, i64 %o", "  %v = load <32 x float>, ptr %src, align 4",
            f"  %p = shufflevector <32 x float> %v, <32 x float> poison, <32 x i32> {_consts(order)}",
            "  %dst = getelementptr float, ptr %xp, i64 %o", "  store <32 x float> %p, ptr %dst, align 4",
            "  %gn = add i64 %g, 1", "  %end = icmp eq i64 %gn, %groups",
            "  br i1 %end, label %done, label %loop", "done:", "  ret void", "}"]


def blocks_ir(isa: str = ISA) -> str:
    out = _f16_ir(isa) + _order_x_ir("vkspec_order_x", group_order(isa)) + _order_x_ir("vkspec_order_staged", STAGED_ORDER)
    if any(staged(n, isa) for n in range(1, MAX_ROWS + 1)):
        for fmt in FORMATS:
            out += _staged_kernel_ir(fmt, isa)
    for fmt in FORMATS:
        for n in range(1, MAX_ROWS + 1):
            out += _gemv_ir(fmt, n, isa)
    return "\n".join(out) + "\n"


def ir_digest(isa: str = ISA) -> str:
    """Names the numba cache folder: every generated IR the kernels link."""
    text = "".join(_ir(r, isa) for r in range(1, MAX_ROWS + 1)) + unpack_ir() + blocks_ir(isa) + row_values_ir(isa) + scores_ir()
    text += "".join(query_scores_ir(g) for g in range(1, QUERY_GROUPS + 1))
    return hashlib.sha1(text.encode()).hexdigest()[:16]
