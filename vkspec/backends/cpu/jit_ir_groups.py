"""The pieces of the block GEMV's LLVM IR that read a GGUF block: each
format's layout (Fmt, FORMATS), its 32-value groups decoded from their bytes
into float vectors (_group) and its scales widened (_unit_scales). The fused
kernels (jit_ir_blocks) and the staged ones (jit_ir_staged) both build on
them; jit_ir_blocks' docstring says why the arithmetic is exact."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import llvmlite.binding as llvm

from . import jit_ir
from .jit_ir import ISA, _consts


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
    instructions a group for it, more than the finish saves at one row."""
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
