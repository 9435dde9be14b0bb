"""The canonical dot product's LLVM IR, generated for an ISA (see jit_dot.py
for what it computes and why it is exact). No numba here: backends/cpu/
numba_cache.py names numba's cache folder after this IR's digest before numba is
imported."""

from __future__ import annotations

import os

import llvmlite.binding as llvm

MAX_ROWS = 8
# floats per vector register, and vector registers the accumulators may take
ISAS = {"avx512": (16, 24), "avx2": (8, 10), "plain": (4, 10)}
FIN = 16                    # the finish reads the parked lanes 16 at a time
# rows one dot call takes where a caller has more: past 4, AVX2's passes
# (8 or 16) each read their share of every row, and the rows stop fitting
# L1 (Zen 3, one core, ns per row and weight row at 1536 columns: 4 rows
# 94, 5 rows 119, 8 rows 249; at 576: 57, 52, 75)
BEST_ROWS = {"avx512": 8, "avx2": 4, "plain": 4}


def chunk_rows(rest: int, best: int) -> int:
    """Rows for the next dot call when `rest` remain: the calls as few as
    take at most `best` rows each, and as even as can be (5, 4: 3 then 2).
    Also compiled (jit_dot registers it for numba)."""
    return -(-rest // -(-rest // best))


def host_isa() -> str:
    forced = os.environ.get("VKSPEC_CPU_ISA")
    if forced:
        if forced not in ISAS:
            raise ValueError(f"VKSPEC_CPU_ISA={forced!r}: one of {', '.join(ISAS)}")
        return forced
    f = llvm.get_host_cpu_features()
    return "avx512" if f.get("avx512f") else "avx2" if f.get("avx2") else "plain"


ISA = host_isa()


def passes(rows: int, isa: str = ISA) -> int:
    """Lane passes for `rows` rows: the fewest that fit the register budget."""
    width, budget = ISAS[isa]
    p = 1
    while p < 128 // width and rows * (128 // p // width) > budget:
        p *= 2
    return p


def _consts(values, ty="i32") -> str:
    return "<" + ", ".join(f"{ty} {v}" for v in values) + ">"


def _ir(rows: int, isa: str = ISA) -> str:
    """define void @vkspec_dot<rows>(ptr w, ptr x, i64 x_stride, ptr out, i64 k):
    out[r] = dot(x[r*x_stride:][:k], w[:k]) in the canonical order, r < rows."""
    V, _ = ISAS[isa]
    P = passes(rows, isa)
    S = 128 // P // V                       # vector slots per pass
    T = f"<{V} x float>"
    R = range(rows)
    L = [f"define void @vkspec_dot{rows}(ptr %w, ptr %x, i64 %xs, ptr %out, i64 %k) {{", "entry:",
         f"  %buf = alloca [{rows * 128} x float], align 64",
         "  %full = lshr i64 %k, 7", "  %tbase = shl i64 %full, 7", "  %rest = sub i64 %k, %tbase",
         f"  %r1 = insertelement <{V} x i64> poison, i64 %rest, i64 0",
         f"  %rs = shufflevector <{V} x i64> %r1, <{V} x i64> poison, <{V} x i32> zeroinitializer"]
    for r in R:
        L += [f"  %xo{r} = mul i64 %xs, {r}", f"  %x{r} = getelementptr float, ptr %x, i64 %xo{r}"]
    L.append("  br label %loop0")

    def fma_free(tag, g, base, load, total):
        """slot g (columns V*g..) of the step at `base`, w loaded once:
        %<total><r>.<g> = acc + x_r * w for every row r."""
        out = [f"  %o{tag} = add i64 {base}, {V * g}",
               f"  %wp{tag} = getelementptr float, ptr %w, i64 %o{tag}", f"  %w{tag} = {load(f'%wp{tag}')}"]
        for r in R:
            out += [f"  %xp{tag}.{r} = getelementptr float, ptr %x{r}, i64 %o{tag}",
                    f"  %xv{tag}.{r} = {load(f'%xp{tag}.{r}')}",
                    f"  %p{tag}.{r} = fmul {T} %xv{tag}.{r}, %w{tag}"]
        return out + [f"  %{total}{r}.{g} = fadd {T} %a{r}.{g}, %p{tag}.{r}" for r in R]

    def plain(ptr):
        return f"load {T}, ptr {ptr}, align 4"

    for p in range(P):
        prev, slots = ("entry" if p == 0 else f"park{p - 1}"), [p * S + s for s in range(S)]
        L += [f"loop{p}:", f"  %c{p} = phi i64 [0, %{prev}], [%cn{p}, %step{p}]"]
        L += [f"  %a{r}.{g} = phi {T} [zeroinitializer, %{prev}], [%n{r}.{g}, %step{p}]" for r in R for g in slots]
        L += [f"  %done{p} = icmp eq i64 %c{p}, %full", f"  br i1 %done{p}, label %tail{slots[0]}, label %step{p}",
              f"step{p}:", f"  %base{p} = shl i64 %c{p}, 7"]
        for g in slots:
            L += fma_free(f"s{g}", g, f"%base{p}", plain, "n")
        L += [f"  %cn{p} = add i64 %c{p}, 1", f"  br label %loop{p}"]
        # the last, partial step: a slot with no column left is skipped (its
        # padding would only add +0), one it fills whole is loaded plainly, and
        # one with some columns under a mask (at 576 columns every pass ends in
        # 64 live columns: masks built there for whole slots were ~1/4 of dot4)
        for i, g in enumerate(slots):
            nxt = f"tail{slots[i + 1]}" if i + 1 < len(slots) else f"park{p}"
            masked = (lambda ptr, g=g: f"call {T} @llvm.masked.load.v{V}f32.p0(ptr {ptr}, i32 4, "  # noqa: E731
                      f"<{V} x i1> %m{g}, {T} zeroinitializer)")
            L += [f"tail{g}:", f"  %live{g} = icmp ugt i64 %rest, {V * g}",
                  f"  br i1 %live{g}, label %some{g}, label %join{g}", f"some{g}:",
                  f"  %whole{g} = icmp uge i64 %rest, {V * g + V}",
                  f"  br i1 %whole{g}, label %full{g}, label %do{g}", f"full{g}:"]
            L += fma_free(f"u{g}", g, "%tbase", plain, "u")
            L += [f"  br label %join{g}", f"do{g}:",
                  f"  %m{g} = icmp ult <{V} x i64> {_consts(range(V * g, V * g + V), 'i64')}, %rs"]
            L += fma_free(f"t{g}", g, "%tbase", masked, "t")
            L += [f"  br label %join{g}", f"join{g}:"]
            L += [f"  %g{r}.{g} = phi {T} [%a{r}.{g}, %tail{g}], [%u{r}.{g}, %full{g}], [%t{r}.{g}, %do{g}]"
                  for r in R]
            L += [f"  br label %{nxt}"]
        L.append(f"park{p}:")
        for r in R:
            for g in slots:
                L += [f"  %bp{r}.{g} = getelementptr float, ptr %buf, i64 {r * 128 + V * g}",
                      f"  store {T} %g{r}.{g}, ptr %bp{r}.{g}, align 4"]
        L.append(f"  br label %{'loop' + str(p + 1) if p + 1 < P else 'finish'}")
    L.append("finish:")
    for r in R:
        L += finish(r, f"{r * 128}", f"{r}")
    L += ["  ret void", "}", f"declare {T} @llvm.masked.load.v{V}f32.p0(ptr, i32, <{V} x i1>, {T})"]
    return "\n".join(L)



def finish(r, at: str, index: str) -> list[str]:
    """exact._finish of the 128 lanes parked at %buf[at:], stored to
    %out[index]: (a[4l] + a[4l+1]) + (a[4l+2] + a[4l+3]), then the lane tree."""
    L, F = [], f"<{FIN} x float>"
    even, odd = _consts(range(0, 2 * FIN, 2)), _consts(range(1, 2 * FIN, 2))
    cur = []
    for j in range(128 // FIN):
        L += [f"  %fo{r}.{j} = add i64 {at}, {FIN * j}",
              f"  %fp{r}.{j} = getelementptr float, ptr %buf, i64 %fo{r}.{j}",
              f"  %f{r}.{j} = load {F}, ptr %fp{r}.{j}, align 4"]
        cur.append(f"%f{r}.{j}")
    for level in range(2):          # a[2i] + a[2i+1], twice: 128 -> 64 -> 32
        nxt = []
        for j in range(len(cur) // 2):
            e, o, q = (f"%{t}{r}.{level}.{j}" for t in "eoq")
            L += [f"  {e} = shufflevector {F} {cur[2 * j]}, {F} {cur[2 * j + 1]}, <{FIN} x i32> {even}",
                  f"  {o} = shufflevector {F} {cur[2 * j]}, {F} {cur[2 * j + 1]}, <{FIN} x i32> {odd}",
                  f"  {q} = fadd {F} {e}, {o}"]
            nxt.append(q)
        cur = nxt
    L.append(f"  %s{r}.{FIN} = fadd {F} {cur[0]}, {cur[1]}")   # s[i] + s[i + 16]
    return L + narrow(r, index)


def narrow(r, index: str, width: int = FIN) -> list[str]:
    """The lane tree's last steps, s[i] + s[i + h] for h = width / 2 .. 1,
    from the sums %s{r}.<width>, and the result stored to %out[index]."""
    L = []
    while width > 1:
        h = width // 2
        src = f"<{width} x float> %s{r}.{width}, <{width} x float> poison"
        L += [f"  %lo{r}.{h} = shufflevector {src}, <{h} x i32> {_consts(range(h))}",
              f"  %hi{r}.{h} = shufflevector {src}, <{h} x i32> {_consts(range(h, width))}",
              f"  %s{r}.{h} = fadd <{h} x float> %lo{r}.{h}, %hi{r}.{h}"]
        width = h
    return L + [f"  %v{r} = extractelement <1 x float> %s{r}.1, i64 0",
                f"  %op{r} = getelementptr float, ptr %out, i64 {index}",
                f"  store float %v{r}, ptr %op{r}, align 4"]


def _pair_sums(L: list[str], cur: list[str], tag: str, left, right) -> list[str]:
    """Each adjacent pair (A, B) of the 16-float vectors cur becomes
    shuffle(A, B, left) + shuffle(A, B, right); returns the sums' names."""
    F, out = "<16 x float>", []
    for j in range(len(cur) // 2):
        a, b, r = f"%{tag}l.{j}", f"%{tag}r.{j}", f"%{tag}s.{j}"
        L += [f"  {a} = shufflevector {F} {cur[2 * j]}, {F} {cur[2 * j + 1]}, <16 x i32> {_consts(left)}",
              f"  {b} = shufflevector {F} {cur[2 * j]}, {F} {cur[2 * j + 1]}, <16 x i32> {_consts(right)}",
              f"  {r} = fadd {F} {a}, {b}"]
        out.append(r)
    return out


def scores_ir() -> str:
    """define void @vkspec_scores(ptr k, i64 k_stride, ptr q, i64 q_stride,
    i64 nq, ptr out, i64 out_stride, i64 nkeys, i64 d, float scale), d <= 64:
    out[i * out_stride + t] = dot(q_i[:d], k_t[:d]) * scale for queries i <
    nq and keys t < nkeys, each dot in exact.dot's order.

    Why: a score is a dot of a few columns (64 on SmolLM2, Llama 3.2 1B,
    Qwen2.5 0.5B), and the GEMV kernel spends most of it on the finish of its
    128 lanes, one key at a time. Here a key's 64 lanes fold to 16 sums
    ((x + y) + (z + w), jit_ir.finish's first steps; lanes 64..127 are the
    definition's +0 padding and their s[i + 16] = +0 leaves s[i] as it is, as
    no lane is ever -0), sixteen keys are parked, and the lane tree of all
    sixteen runs at once: the shuffles pair key A's lanes i and i + h with
    key B's, so each output is still s[i] + s[i + h] for h = 8, 4, 2, 1.
    Columns past d load +0 (the padding). Vectors are 16 floats; LLVM
    splits them for narrower ISAs."""
    F, M = "<16 x float>", "<16 x i1>"
    ml = "@llvm.masked.load.v16f32.p0"
    L = ["define void @vkspec_scores(ptr %k, i64 %ks, ptr %q, i64 %qs, i64 %nq, ptr %out, i64 %os, i64 %nkeys, "
         "i64 %d, float %scale) {", "entry:", "  %sbuf = alloca [256 x float], align 64",
         "  %tiles0 = add i64 %nkeys, 15", "  %tiles = lshr i64 %tiles0, 4", "  %lastkey = sub i64 %nkeys, 1"]
    L += _splat("sc", "%scale", 16, "float") + _splat("dd", "%d", 16, "i64")
    L += [f"  %m{g} = icmp slt <16 x i64> {_consts(range(16 * g, 16 * g + 16), 'i64')}, %dd" for g in range(4)]
    L += ["  br label %tile",
          "tile:", "  %ti = phi i64 [0, %entry], [%tin, %qdone]", "  %tmore = icmp ult i64 %ti, %tiles",
          "  br i1 %tmore, label %tbody, label %exit",
          "tbody:", "  %t0 = shl i64 %ti, 4", "  %left = sub i64 %nkeys, %t0"]
    L += _splat("lf", "%left", 16, "i64")
    L += [f"  %smask = icmp slt <16 x i64> {_consts(range(16), 'i64')}, %lf", "  br label %query",
          "query:", "  %qi = phi i64 [0, %tbody], [%qin, %tree]", "  %qmore = icmp ult i64 %qi, %nq",
          "  br i1 %qmore, label %qbody, label %qdone",
          "qbody:", "  %qo = mul i64 %qi, %qs", "  %qrow = getelementptr float, ptr %q, i64 %qo"]
    for g in range(4):
        L += [f"  %qp{g} = getelementptr float, ptr %qrow, i64 {16 * g}",
              f"  %qv{g} = call {F} {ml}(ptr %qp{g}, i32 4, {M} %m{g}, {F} zeroinitializer)"]
    L += ["  br label %key",
          "key:", "  %tt = phi i64 [0, %qbody], [%ttn, %kbody]", "  %kmore = icmp ult i64 %tt, 16",
          "  br i1 %kmore, label %kbody, label %tree",
          "kbody:", "  %t1 = add i64 %t0, %tt", "  %tover = icmp sgt i64 %t1, %lastkey",
          "  %t = select i1 %tover, i64 %lastkey, i64 %t1",          # past the last key: reread it, not stored
          "  %ko = mul i64 %t, %ks", "  %krow = getelementptr float, ptr %k, i64 %ko"]
    for g in range(4):
        L += [f"  %kp{g} = getelementptr float, ptr %krow, i64 {16 * g}",
              f"  %kv{g} = call {F} {ml}(ptr %kp{g}, i32 4, {M} %m{g}, {F} zeroinitializer)",
              f"  %p{g} = fmul {F} %qv{g}, %kv{g}", f"  %a{g} = fadd {F} zeroinitializer, %p{g}"]
    cur = [f"%a{g}" for g in range(4)]
    for level in range(2):                     # 64 lanes -> 32 -> 16: (x + y) + (z + w)
        cur = _pair_sums(L, cur, f"f{level}", range(0, 32, 2), range(1, 32, 2))
    L += ["  %bo = shl i64 %tt, 4", "  %bp = getelementptr float, ptr %sbuf, i64 %bo",
          f"  store {F} {cur[0]}, ptr %bp, align 4", "  %ttn = add i64 %tt, 1", "  br label %key"]
    L.append("tree:")                          # sixteen keys' lane trees at once
    cur = []
    for j in range(16):
        L += [f"  %tp{j} = getelementptr float, ptr %sbuf, i64 {16 * j}", f"  %tv{j} = load {F}, ptr %tp{j}, align 4"]
        cur.append(f"%tv{j}")
    h = 8
    while h:                                   # s[i] + s[i + h] of two keys, side by side
        cur = _pair_sums(L, cur, f"h{h}", [b + i for b in range(0, 32, 2 * h) for i in range(h)],
                         [b + h + i for b in range(0, 32, 2 * h) for i in range(h)])
        h //= 2
    L += [f"  %scaled = fmul {F} {cur[0]}, %sc", "  %oo0 = mul i64 %qi, %os", "  %oo = add i64 %oo0, %t0",
          "  %op = getelementptr float, ptr %out, i64 %oo",
          f"  call void @llvm.masked.store.v16f32.p0({F} %scaled, ptr %op, i32 4, {M} %smask)",
          "  %qin = add i64 %qi, 1", "  br label %query",
          "qdone:", "  %tin = add i64 %ti, 1", "  br label %tile",
          "exit:", "  ret void", "}",
          f"declare {F} {ml}(ptr, i32, {M}, {F})", f"declare void @llvm.masked.store.v16f32.p0({F}, ptr, i32, {M})"]
    return "\n".join(L) + "\n"


QUERY_LANES = 8             # queries a query_scores vector holds
QUERY_GROUPS = 16           # widest head: 4 * 16 columns


def query_scores_ir(groups: int) -> str:
    """define void @vkspec_qscores<groups>(ptr k, i64 k_stride, ptr qt, ptr
    out, i64 nkeys, float scale), d = 4 * groups <= 64 columns: out[t * 8 +
    i] = dot(q_i[:d], k_t[:d]) * scale for keys t < nkeys and the 8 queries
    of qt, their columns as rows (qt[c * 8 + i] = q_i[c]).

    Why: the verify rows' queries share their KV head's keys, and with one
    query per vector lane every step of exact.dot's order is a vertical add,
    no shuffles: lane i's products p_c = q_i[c] * k_t[c], then (p_4l +
    p_4l+1) + (p_4l+2 + p_4l+3) = s_l (the finish's first steps; lanes d..127
    are the definition's +0 padding, so s_l for 4l >= d is +0), then s_i +
    s_i+h for h = 8, 4, 2, 1 with the +0 terms left out. Also left out are
    the definition's +0 + p_c: a sum of two values can only differ from the
    definition's by the sign of a zero (the definition never has -0, as
    +0 + -0 = +0; here -0 + -0 = -0), so the one + 0 at the end gives its
    bits. (Two or four keys a step, each query column loaded once for them,
    ran no faster on Zen 3.)"""
    T = "<8 x float>"
    L = [f"define void @vkspec_qscores{groups}(ptr %k, i64 %ks, ptr %qt, ptr %out, i64 %nkeys, float %scale) {{",
         "entry:"] + _splat("sc", "%scale", 8, "float")
    L += ["  br label %key",
          "key:", "  %t = phi i64 [0, %entry], [%tn, %body]", "  %more = icmp ult i64 %t, %nkeys",
          "  br i1 %more, label %body, label %exit",
          "body:", "  %ko = mul i64 %t, %ks", "  %krow = getelementptr float, ptr %k, i64 %ko"]
    for c in range(4 * groups):
        L += [f"  %qp{c} = getelementptr float, ptr %qt, i64 {8 * c}", f"  %qv{c} = load {T}, ptr %qp{c}, align 4",
              f"  %kp{c} = getelementptr float, ptr %krow, i64 {c}", f"  %kx{c} = load float, ptr %kp{c}, align 4"]
        L += _splat(f"kb{c}x", f"%kx{c}", 8, "float") + [f"  %p{c} = fmul {T} %qv{c}, %kb{c}x"]
    cur = []
    for g in range(groups):
        L += [f"  %a{g} = fadd {T} %p{4 * g}, %p{4 * g + 1}", f"  %b{g} = fadd {T} %p{4 * g + 2}, %p{4 * g + 3}",
              f"  %s{g} = fadd {T} %a{g}, %b{g}"]
        cur.append(f"%s{g}")
    cur += [None] * (16 - groups)                 # the +0 of lanes d..63
    h = 8
    while h:                                       # s_i + s_i+h, the +0 terms left out
        for i in range(h):
            if cur[i + h] is not None:
                L.append(f"  %h{h}.{i} = fadd {T} {cur[i]}, {cur[i + h]}")
                cur[i] = f"%h{h}.{i}"
        h //= 2
    L += [f"  %z = fadd {T} {cur[0]}, zeroinitializer", f"  %r = fmul {T} %z, %sc", "  %oo = shl i64 %t, 3",
          "  %op = getelementptr float, ptr %out, i64 %oo", f"  store {T} %r, ptr %op, align 4",
          "  %tn = add i64 %t, 1", "  br label %key", "exit:", "  ret void", "}"]
    return "\n".join(L) + "\n"


# vectors of columns a row_values pass holds, widest first: the widest pass that fits the
# head's columns runs, the narrowest also takes a partial last one. AVX2 holds 4 (16
# registers); AVX-512 takes a 128-column head in one pass of 8: eight accumulators hide an
# add's latency that four did not (a key's probability is read once, not twice)
ROW_VALUES_VECTORS = {"avx512": (8, 4), "avx2": (4,), "plain": (4,)}


def row_values_ir(isa: str = ISA) -> str:
    """define void @vkspec_row_values(ptr p, ptr v, i64 v_stride, i64 lo,
    i64 hi, i64 d, ptr out): out[e] = dot(p, v[:, e]) over keys lo <= j <
    hi for every column e < d, key j in lane j mod 128 (its probability
    p[j], its value row v + j * v_stride): one query's attention values, in
    exact.dot's order.

    Why: the values as lanes in memory (acc (128, d) zeroed, each key's row
    loaded, added and stored back, then folded) cost a store a product and
    a 32 KB clear a head, and the verify rows' one-query-a-lane kernel ran
    a loop per lane of one or two keys for each 8 columns of 8 queries. A pass takes
    C vectors of columns (ROW_VALUES_VECTORS); for each lane quad l its four lanes run over
    their keys in registers (lane j: +0, then + p[t] * v[t] for t = j, j +
    128, ... in [lo, hi)), s_l = (a_4l + a_4l+1) + (a_4l+2 + a_4l+3) is
    parked, and the 32 s_l of each vector go through the tree (s_i + s_i+h,
    h = 16 .. 1). Keys outside [lo, hi) are skipped: past hi the definition
    has its +0 padding, and before a window a probability of +0 times a
    value read as 0; adding +0 changes no lane, as no lane is ever -0.
    One fmul then one fadd, no fast-math flags."""
    V, widths = ISAS[isa][0], ROW_VALUES_VECTORS[isa]
    T, M = f"<{V} x float>", f"<{V} x i1>"
    L = ["define void @vkspec_row_values(ptr %p, ptr %v, i64 %vs, i64 %lo, i64 %hi, i64 %d, ptr %out) {",
         "entry:", f"  %sbuf = alloca {T}, i64 {32 * max(widths)}, align 64"] + _splat("dv", "%d", V, "i64")
    back = ", ".join(["[0, %entry]"] + [f"[%c0n{C}, %full{C}.done]" for C in widths])
    L += ["  br label %chunk", "chunk:", f"  %c0 = phi i64 {back}", f"  br label %try{widths[0]}"]
    for i, C in enumerate(widths):                      # the widest whole pass that fits, else the partial one
        other = f"try{widths[i + 1]}" if i + 1 < len(widths) else "last"
        L += [f"try{C}:", f"  %c0e{C} = add i64 %c0, {V * C}", f"  %whole{C} = icmp ule i64 %c0e{C}, %d",
              f"  br i1 %whole{C}, label %full{C}, label %{other}"]
    L += ["last:", "  %any = icmp ult i64 %c0, %d", "  br i1 %any, label %part, label %exit"]
    for C in widths:
        L += [f"full{C}:"] + _row_values_pass(f"full{C}", False, f"full{C}.done", V, C)
        L += [f"full{C}.done:", f"  %c0n{C} = add i64 %c0, {V * C}", "  br label %chunk"]
    L += ["part:"] + _row_values_pass("part", True, "exit", V, widths[-1])
    L += ["exit:", "  ret void", "}",
          f"declare {T} @llvm.masked.load.v{V}f32.p0(ptr, i32, {M}, {T})",
          f"declare void @llvm.masked.store.v{V}f32.p0({T}, ptr, i32, {M})"]
    return "\n".join(L) + "\n"


def _row_values_pass(pf: str, masked: bool, after: str, V: int, C: int) -> list[str]:
    """row_values_ir's pass over C vectors of columns from %c0 (masked: the
    last, partial one), then a branch to `after`."""
    T, M = f"<{V} x float>", f"<{V} x i1>"
    B = []
    if masked:                                          # column c0 + V k + e < d
        for k in range(C):
            B += _splat(f"{pf}.cs{k}x", f"%c0", V, "i64") + [
                f"  %{pf}.col{k} = add <{V} x i64> %{pf}.cs{k}x, {_consts(range(V * k, V * k + V), 'i64')}",
                f"  %{pf}.m{k} = icmp ult <{V} x i64> %{pf}.col{k}, %dv"]

    def load(ptr, k):
        return (f"call {T} @llvm.masked.load.v{V}f32.p0(ptr {ptr}, i32 4, {M} %{pf}.m{k}, {T} zeroinitializer)"
                if masked else f"load {T}, ptr {ptr}, align 4")

    B += [f"  br label %{pf}.l", f"{pf}.l:", f"  %{pf}.li = phi i64 [0, %{pf}], [%{pf}.ln, %{pf}.sum]",
          f"  %{pf}.lmore = icmp ult i64 %{pf}.li, 32", f"  br i1 %{pf}.lmore, label %{pf}.q0, label %{pf}.tree"]
    for i in range(4):                                  # lane j = 4 l + i
        q = f"{pf}.q{i}"
        nxt = f"{pf}.q{i + 1}" if i < 3 else f"{pf}.sum"
        B += [f"{q}:", f"  %{q}.l4 = shl i64 %{pf}.li, 2", f"  %{q}.j = add i64 %{q}.l4, {i}",
              f"  %{q}.dd = sub i64 %lo, %{q}.j", f"  %{q}.dp = icmp sgt i64 %{q}.dd, 0",
              f"  %{q}.dz = select i1 %{q}.dp, i64 %{q}.dd, i64 0", f"  %{q}.dr = add i64 %{q}.dz, 127",
              f"  %{q}.dq = lshr i64 %{q}.dr, 7", f"  %{q}.ds = shl i64 %{q}.dq, 7",
              f"  %{q}.t0 = add i64 %{q}.j, %{q}.ds", f"  br label %{q}.k",
              f"{q}.k:", f"  %{q}.t = phi i64 [%{q}.t0, %{q}], [%{q}.tn, %{q}.kb]"]
        B += [f"  %{q}.a{k} = phi {T} [zeroinitializer, %{q}], [%{q}.an{k}, %{q}.kb]" for k in range(C)]
        B += [f"  %{q}.more = icmp slt i64 %{q}.t, %hi", f"  br i1 %{q}.more, label %{q}.kb, label %{nxt}",
              f"{q}.kb:", f"  %{q}.pp = getelementptr float, ptr %p, i64 %{q}.t",
              f"  %{q}.pt = load float, ptr %{q}.pp, align 4"] + _splat(f"{q}.ps", f"%{q}.pt", V, "float")
        B += [f"  %{q}.vo = mul i64 %{q}.t, %vs", f"  %{q}.vc = add i64 %{q}.vo, %c0"]
        for k in range(C):
            B += [f"  %{q}.vi{k} = add i64 %{q}.vc, {V * k}", f"  %{q}.vp{k} = getelementptr float, ptr %v, i64 %{q}.vi{k}",
                  f"  %{q}.x{k} = {load(f'%{q}.vp{k}', k)}", f"  %{q}.pr{k} = fmul {T} %{q}.ps, %{q}.x{k}",
                  f"  %{q}.an{k} = fadd {T} %{q}.a{k}, %{q}.pr{k}"]
        B += [f"  %{q}.tn = add i64 %{q}.t, 128", f"  br label %{q}.k"]
    B += [f"{pf}.sum:", f"  %{pf}.so = mul i64 %{pf}.li, {C}"]
    for k in range(C):                                  # (a_4l + a_4l+1) + (a_4l+2 + a_4l+3)
        a = [f"%{pf}.q{i}.a{k}" for i in range(4)]
        B += [f"  %{pf}.x{k} = fadd {T} {a[0]}, {a[1]}", f"  %{pf}.y{k} = fadd {T} {a[2]}, {a[3]}",
              f"  %{pf}.s{k} = fadd {T} %{pf}.x{k}, %{pf}.y{k}", f"  %{pf}.si{k} = add i64 %{pf}.so, {k}",
              f"  %{pf}.sp{k} = getelementptr {T}, ptr %sbuf, i64 %{pf}.si{k}",
              f"  store {T} %{pf}.s{k}, ptr %{pf}.sp{k}, align 32"]
    B += [f"  %{pf}.ln = add i64 %{pf}.li, 1", f"  br label %{pf}.l", f"{pf}.tree:"]
    for k in range(C):                                  # s_i + s_i+h, h = 16 .. 1
        cur = []
        for l in range(32):
            B += [f"  %{pf}.tp{k}.{l} = getelementptr {T}, ptr %sbuf, i64 {C * l + k}",
                  f"  %{pf}.tl{k}.{l} = load {T}, ptr %{pf}.tp{k}.{l}, align 32"]
            cur.append(f"%{pf}.tl{k}.{l}")
        h = 16
        while h:
            for l in range(h):
                B.append(f"  %{pf}.h{k}.{h}.{l} = fadd {T} {cur[l]}, {cur[l + h]}")
                cur[l] = f"%{pf}.h{k}.{h}.{l}"
            h //= 2
        B += [f"  %{pf}.oi{k} = add i64 %c0, {V * k}", f"  %{pf}.op{k} = getelementptr float, ptr %out, i64 %{pf}.oi{k}"]
        B.append(f"  call void @llvm.masked.store.v{V}f32.p0({T} {cur[0]}, ptr %{pf}.op{k}, i32 4, {M} %{pf}.m{k})"
                 if masked else f"  store {T} {cur[0]}, ptr %{pf}.op{k}, align 4")
    return B + [f"  br label %{after}"]


def _splat(name: str, value: str, n: int, ty: str) -> list[str]:
    return [f"  %{name}1 = insertelement <{n} x {ty}> poison, {ty} {value}, i64 0",
            f"  %{name} = shufflevector <{n} x {ty}> %{name}1, <{n} x {ty}> poison, <{n} x i32> zeroinitializer"]


def unpack_ir() -> str:
    """The block formats' inner loops as vector IR (numba compiles its own
    loops over uint8 quants to one scalar conversion a value):

    * vkspec_q4_0(src, dst, d): 16 bytes -> dst[0:16] = d * (lo - 8),
      dst[16:32] = d * (hi - 8)
    * vkspec_q4_1(src, dst, d, m): d * lo + m, d * hi + m
    * vkspec_q4_k(src, dst, d, m, shift): 32 bytes -> d * ((b >> shift) & 15) - m
    * vkspec_q8_0(src, dst, d): 32 signed bytes -> q * d

    The formulas of formats/ggml.py, one fmul and one fadd/fsub each with no
    fast-math flags (never fused); every integer converts to float exactly."""
    out = []
    for name, sub8, tail in (("q4_0", True, None), ("q4_1", False, "fadd")):
        L = [f"define void @vkspec_{name}(ptr %src, ptr %dst, float %d, float %m) {{", "entry:",
             "  %v = load <16 x i8>, ptr %src, align 1",
             f"  %lo = and <16 x i8> %v, {_consts([15] * 16, 'i8')}",
             f"  %hi = lshr <16 x i8> %v, {_consts([4] * 16, 'i8')}"]
        L += _splat("ds", "%d", 16, "float") + _splat("ms", "%m", 16, "float")
        for h, at in (("lo", 0), ("hi", 16)):
            L.append(f"  %{h}w = zext <16 x i8> %{h} to <16 x i32>")
            if sub8:
                L.append(f"  %{h}s = sub <16 x i32> %{h}w, {_consts([8] * 16)}")
                L.append(f"  %{h}f = sitofp <16 x i32> %{h}s to <16 x float>")
            else:
                L.append(f"  %{h}f = uitofp <16 x i32> %{h}w to <16 x float>")
            L.append(f"  %{h}p = fmul <16 x float> %ds, %{h}f")
            res = f"%{h}p"
            if tail:
                L.append(f"  %{h}r = {tail} <16 x float> %{h}p, %ms")
                res = f"%{h}r"
            L += [f"  %{h}d = getelementptr float, ptr %dst, i64 {at}",
                  f"  store <16 x float> {res}, ptr %{h}d, align 4"]
        out += L + ["  ret void", "}"]
    out += ["define void @vkspec_q4_k(ptr %src, ptr %dst, float %d, float %m, i8 %shift) {", "entry:",
            "  %v = load <32 x i8>, ptr %src, align 1"] + _splat("sh", "%shift", 32, "i8") + [
            "  %s = lshr <32 x i8> %v, %sh", f"  %q = and <32 x i8> %s, {_consts([15] * 32, 'i8')}",
            "  %qf = uitofp <32 x i8> %q to <32 x float>"] + _splat("ds", "%d", 32, "float") + \
        _splat("ms", "%m", 32, "float") + [
            "  %p = fmul <32 x float> %ds, %qf", "  %r = fsub <32 x float> %p, %ms",
            "  store <32 x float> %r, ptr %dst, align 4", "  ret void", "}"]
    out += ["define void @vkspec_q8_0(ptr %src, ptr %dst, float %d) {", "entry:",
            "  %v = load <32 x i8>, ptr %src, align 1", "  %qf = sitofp <32 x i8> %v to <32 x float>"] + \
        _splat("ds", "%d", 32, "float") + [
            "  %p = fmul <32 x float> %qf, %ds", "  store <32 x float> %p, ptr %dst, align 4", "  ret void", "}"]
    return "\n".join(out) + "\n"
