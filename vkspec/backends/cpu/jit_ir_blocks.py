"""LLVM IR for the GEMV over GGUF blocks, generated for an ISA:
vkspec_gemv<n>_<fmt>, n <= MAX_ROWS input rows against every weight row,
with the weight values never written anywhere (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q6_K: what SmolLM2, Llama and Gemma GGUFs hold).

Why: decoding a row into a buffer and then dotting the buffer made the CPU
path's plain decoding a fraction of the memory's speed. Here each 32 values go
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

import hashlib

from .jit_ir import (ISA, ISAS, MAX_ROWS, QUERY_GROUPS, _consts, _ir, finish, narrow, query_scores_ir,
                     row_values_ir, scores_ir, unpack_ir)
from .jit_ir_groups import FORMATS, PERM, _f16_ir, _group, _unit_scales, group_order
from .jit_ir_staged import STAGED_ORDER, _staged_ir, _staged_kernel_ir, fused_passes, staged


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
        L += _park(p, offs, S, R, V) + [f"  br label %{'loop' + str(p + 1) if p + 1 < P else 'finish'}"]
    return L + _finish_rows(R, order)


def _park(p: int, offs, S: int, R, V: int) -> list[str]:
    """Pass p's lanes (its lane groups offs) stored to %buf, 128 a row."""
    L = [f"park{p}:"]
    for o in offs:
        for i in range(S):
            for r in R:
                L += [f"  %pk{p}.{o}.{i}.{r} = getelementptr float, ptr %buf, i64 {128 * r + 32 * o + V * i}",
                      f"  store <{V} x float> %g{p}.{o}.{i}.{r}, ptr %pk{p}.{o}.{i}.{r}, align 4"]
    return L


def _finish_rows(R, order) -> list[str]:
    """Each row's 128 parked lanes finished to its output, then the next weight row."""
    L = ["finish:"]
    for r in R:
        L += [f"  %oi{r} = mul i64 %os, {r}", f"  %om{r} = add i64 %oi{r}, %m"]
        L += _finish(r, 128 * r, f"%om{r}") if order == PERM else finish(r, f"{128 * r}", f"%om{r}")
    return L + ["  %mn = add i64 %m, 1", "  %last = icmp eq i64 %mn, %rows",
                "  br i1 %last, label %done, label %row", "done:", "  ret void", "}"]


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
