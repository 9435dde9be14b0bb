"""The staged block GEMV kernels (LLVM IR): where a decoding pass cannot hold
the lanes of every input row in registers (AVX2 past 2 rows, plain past 1),
each weight row is decoded once into a buffer laid out for the finish and
then dotted with every input row. jit_ir_blocks says why the arithmetic is
exact; the same values and lanes as the fused kernels."""

from __future__ import annotations

from .jit_ir import ISA, ISAS, _consts, narrow
from .jit_ir_groups import COLUMNS, FORMATS, _group, _splat, _unit_scales


# rows a staged kernel's pass takes at most: 4 vectors of 8 floats each, with
# one weight vector and a product beside them (AVX2: 3 rows, 14 of 16 ymm;
# plain SSE halves the vectors, so 1). A pass of 3 rows loads the weight
# vector once for 3 products instead of 2.
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
            L += _staged_pass(k, o, V)
        L += [f"  %rn{k} = add i64 %r0, {k}", f"  %sets{k} = icmp ult i64 %rn{k}, %n",
              f"  br i1 %sets{k}, label %set, label %emit"]
    return L + _staged_emit(T)


def _staged_pass(k: int, o: int, V: int) -> list[str]:
    """Group o of every step for the set of k input rows from %r0: their
    lanes in registers over the decoded row, each row's 8 sums parked in %tb."""
    T, tag = f"<{V} x float>", f"{k}.{o}"
    acc = [(i, j) for i in range(k) for j in range(4)]
    L = [f"p{tag}:", f"  br label %l{tag}", f"l{tag}:", f"  %c{tag} = phi i64 [0, %p{tag}], [%cn{tag}, %b{tag}]"]
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
    return L


def _staged_emit(T: str) -> list[str]:
    """Each input row's parked sums finished to its output, then the next weight row."""
    L = ["emit:", "  br label %er", "er:", "  %r = phi i64 [0, %emit], [%rnext, %er]", "  %tr = shl i64 %r, 2"]
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
