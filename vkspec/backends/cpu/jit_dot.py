"""The canonical dot product (exact.dot's order) as hand-written LLVM IR, for
numba kernels: ``dot(w, x)``, ``dot2(w, x0, x1)``, ``dot3(w, x0, x1, x2)``.

Why IR: the definition keeps 128 running lanes (exact.REDUCE_LANES x
REDUCE_VEC). Written in numba they live in a heap array, so each product
costs a load and a store of its lane besides the two operand loads, and a
verify row cost ~0.4 of a SmolLM2 step. Here the lanes are SSA values, eight
<16 x float> registers per output, and ``dot2``/``dot3`` read each weight
vector once for two or three rows (24 of AVX-512's 32 registers at most).

Why it is exact: lane j of output r is +0, then + x_r[128c + j] * w[128c + j]
for c ascending, one ``fmul`` then one ``fadd`` with no fast-math flags, so
LLVM may neither fuse nor reassociate them. A last partial step loads zeros
past k (the definition's zero padding: +0 products, and no lane is ever -0).
The finish is exact._finish's order: (a[4l] + a[4l+1]) + (a[4l+2] + a[4l+3])
per lane l, then s[i] + s[i + stride] for stride 16, 8, 4, 2, 1, written as
even/odd and low/high shuffles. ``test_exact_core`` holds every kernel that
uses these to exact.gemv bit for bit and reads their machine code for FMAs.
(x86 may swap a product's operands, so when x and w are both NaN in one
column the payload can be w's: NaN payloads are outside the contract.)

Callers must pass w and every x with at least len(x0) elements (nothing here
checks; gemv and expert_mlps assert it in Python).

numba's cache keys a function on its own file, not on this IR, so a change
here would leave callers' cached code linked to the old kernel: the first
import after a change clears cpu_jit's and cpu_jit_math's cached code.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

V = 16                      # floats per vector register
SLOTS = 128 // V            # registers per 128-lane accumulator
F32 = f"<{V} x float>"


def _consts(values, ty="i32") -> str:
    return "<" + ", ".join(f"{ty} {v}" for v in values) + ">"


def _ir(rows: int) -> str:
    """define void @vkspec_dot<rows>(ptr w, ptr x_0.., ptr out, i64 k):
    out[r] = dot(x_r[:k], w[:k]) in the canonical order."""
    name = f"vkspec_dot{rows}"
    R = range(rows)
    xs = "".join(f", ptr %x{r}" for r in R)
    L = [f"define void @{name}(ptr %w{xs}, ptr %out, i64 %k) {{",
         "entry:", "  %full = lshr i64 %k, 7", "  br label %loop",
         "loop:", "  %c = phi i64 [0, %entry], [%c.next, %step]"]
    L += [f"  %a{r}.{s} = phi {F32} [zeroinitializer, %entry], [%n{r}.{s}, %step]"
          for r in R for s in range(SLOTS)]
    L += ["  %done = icmp eq i64 %c, %full", "  br i1 %done, label %check, label %step",
          "step:", "  %base = shl i64 %c, 7"]

    def slot(tag, s, load, into, acc):
        """one 16-column slot of a 128-column step: acc + x_r * w, w loaded once."""
        out = [f"  %{tag}o{s} = add i64 %{tag}base, {V * s}",
               f"  %{tag}wp{s} = getelementptr float, ptr %w, i64 %{tag}o{s}",
               f"  %{tag}w{s} = {load(f'%{tag}wp{s}', s)}"]
        for r in R:
            out += [f"  %{tag}xp{r}.{s} = getelementptr float, ptr %x{r}, i64 %{tag}o{s}",
                    f"  %{tag}x{r}.{s} = {load(f'%{tag}xp{r}.{s}', s)}",
                    f"  %{tag}p{r}.{s} = fmul {F32} %{tag}x{r}.{s}, %{tag}w{s}",
                    f"  %{into}{r}.{s} = fadd {F32} %{acc}{r}.{s}, %{tag}p{r}.{s}"]
        return out

    for s in range(SLOTS):
        L += slot("", s, lambda p, s: f"load {F32}, ptr {p}, align 4", "n", "a")
    L += ["  %c.next = add i64 %c, 1", "  br label %loop",
          "check:", "  %tbase = shl i64 %full, 7", "  %rest = sub i64 %k, %tbase",
          f"  %r1 = insertelement <{V} x i64> poison, i64 %rest, i64 0",
          f"  %rs = shufflevector <{V} x i64> %r1, <{V} x i64> poison, <{V} x i32> zeroinitializer",
          "  br label %slot0"]
    # the last, partial step: a slot with no column left is skipped (its
    # padding would only add +0), one with some is loaded under a mask
    masked = lambda p, s: (f"call {F32} @llvm.masked.load.v{V}f32.p0(ptr {p}, i32 4, "  # noqa: E731
                           f"<{V} x i1> %m{s}, {F32} zeroinitializer)")
    for s in range(SLOTS):
        L += [f"slot{s}:", f"  %live{s} = icmp ugt i64 %rest, {V * s}",
              f"  br i1 %live{s}, label %do{s}, label %join{s}", f"do{s}:",
              f"  %m{s} = icmp ult <{V} x i64> {_consts(range(V * s, V * s + V), 'i64')}, %rs"]
        L += slot("t", s, masked, "t", "a")
        L += [f"  br label %join{s}", f"join{s}:"]
        L += [f"  %g{r}.{s} = phi {F32} [%a{r}.{s}, %slot{s}], [%t{r}.{s}, %do{s}]" for r in R]
        L += [f"  br label %{'slot' + str(s + 1) if s + 1 < SLOTS else 'finish'}"]
    L += ["finish:"]
    even, odd = _consts(range(0, 2 * V, 2)), _consts(range(1, 2 * V, 2))
    for r in R:
        cur = [f"%g{r}.{s}" for s in range(SLOTS)]
        for level in range(2):          # a[2i] + a[2i+1], twice: 128 -> 64 -> 32
            nxt = []
            for j in range(len(cur) // 2):
                e, o, q = (f"%{t}{r}.{level}.{j}" for t in "eoq")
                L += [f"  {e} = shufflevector {F32} {cur[2 * j]}, {F32} {cur[2 * j + 1]}, <{V} x i32> {even}",
                      f"  {o} = shufflevector {F32} {cur[2 * j]}, {F32} {cur[2 * j + 1]}, <{V} x i32> {odd}",
                      f"  {q} = fadd {F32} {e}, {o}"]
                nxt.append(q)
            cur = nxt
        L.append(f"  %s{r}.{V} = fadd {F32} {cur[0]}, {cur[1]}")   # s[i] + s[i + 16]
        width = V
        while width > 1:
            h = width // 2
            src = f"<{width} x float> %s{r}.{width}, <{width} x float> poison"
            L += [f"  %lo{r}.{h} = shufflevector {src}, <{h} x i32> {_consts(range(h))}",
                  f"  %hi{r}.{h} = shufflevector {src}, <{h} x i32> {_consts(range(h, width))}",
                  f"  %s{r}.{h} = fadd <{h} x float> %lo{r}.{h}, %hi{r}.{h}"]
            width = h
        L += [f"  %v{r} = extractelement <1 x float> %s{r}.1, i64 0",
              f"  %op{r} = getelementptr float, ptr %out, i64 {r}",
              f"  store float %v{r}, ptr %op{r}, align 4"]
    L += ["  ret void", "}",
          f"declare {F32} @llvm.masked.load.v{V}f32.p0(ptr, i32, <{V} x i1>, {F32})"]
    return "\n".join(L)


_LIBRARIES = {}


def ir_digest() -> str:
    return hashlib.sha1("".join(_ir(r) for r in (1, 2, 3)).encode()).hexdigest()[:16]


def clear_stale_cache(cache: Path = Path(__file__).parent / "__pycache__"):
    """Drop cpu_jit's and cpu_jit_math's cached code unless it was compiled
    against this IR (a stamp file names the IR's digest)."""
    stamp = cache / f"jit_dot.{ir_digest()}.ir"
    try:
        if cache.is_dir() and not stamp.exists():
            for f in list(cache.glob("jit.*.nb[ic]")) + list(cache.glob("jit_math.*.nb[ic]")):
                f.unlink()
            for f in cache.glob("jit_dot.*.ir"):
                f.unlink()
            stamp.touch()
    except OSError:
        pass        # a read-only install: its files, and so its cache, do not change


clear_stale_cache()


def _library(context, rows: int):
    """The kernel compiled once per process, linked into each numba function
    that calls it (numba's cache keeps the linked code)."""
    key = (id(context.codegen()), rows)
    if key not in _LIBRARIES:
        lib = context.codegen().create_library(f"vkspec_dot{rows}")
        module = llvm.parse_assembly(_ir(rows))
        module.verify()
        lib.add_llvm_module(module)
        _LIBRARIES[key] = lib
    return _LIBRARIES[key]


def _typed(*arrays) -> bool:
    return all(isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"
               and a.dtype == types.float32 for a in arrays)


def _codegen(rows: int):
    def codegen(context, builder, sig, args):
        context.active_code_library.add_linking_library(_library(context, rows))
        ptr = ir.PointerType(ir.IntType(8))
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr] * (rows + 2) + [i64]), f"vkspec_dot{rows}")
        arrays = [context.make_array(t)(context, builder, v) for t, v in zip(sig.args, args)]
        data = [builder.bitcast(a.data, ptr) for a in arrays]
        k = builder.extract_value(arrays[1].shape, 0)
        out = cgutils.alloca_once(builder, ir.FloatType(), size=rows)
        builder.call(fn, data + [builder.bitcast(out, ptr), k])
        vals = [builder.load(builder.gep(out, [ir.Constant(i64, r)])) for r in range(rows)]
        return vals[0] if rows == 1 else context.make_tuple(builder, sig.return_type, vals)
    return codegen


@intrinsic
def dot(typingctx, w, x):
    """dot(x, w[:len(x)]) in the canonical order; w must hold at least len(x)
    (a zero-padded weight row may be longer)."""
    if _typed(w, x):
        return types.float32(w, x), _codegen(1)


@intrinsic
def dot2(typingctx, w, x0, x1):
    """(dot(x0, w), dot(x1, w)), each as dot alone computes it; x1 must be as long as x0."""
    if _typed(w, x0, x1):
        return types.UniTuple(types.float32, 2)(w, x0, x1), _codegen(2)


@intrinsic
def dot3(typingctx, w, x0, x1, x2):
    """dot2 for three rows."""
    if _typed(w, x0, x1, x2):
        return types.UniTuple(types.float32, 3)(w, x0, x1, x2), _codegen(3)


def machine_code() -> str:
    """The kernels' own assembly (in callers' inspect_asm they are inlined,
    hard to tell apart); call after a caller has compiled, as cpu_jit does."""
    from numba.core.registry import cpu_target
    return "\n".join(_library(cpu_target.target_context, r).get_asm_str() for r in (1, 2, 3))
