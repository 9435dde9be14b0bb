"""The float32 behaviour vkspec's exact path relies on, as cases with their
exact answers: what a device (backends/vulkan/probe.py) and the CPU
(backends/cpu/fpenv.py) are checked against at start-up.

What the arithmetic assumes (exact.py, exact.glsl, the shaders):
* + - * round to nearest, ties to even, on every value, denormals included
  (gradual underflow: no flush to zero of inputs or outputs);
* -0 follows IEEE 754 through + - * (x - x = +0, -0 + -0 = -0, signs of
  products), and so do inf and NaN (a NaN operand gives a NaN; which NaN,
  its payload and sign, is not part of the contract);
* a*b + c written as two operations is two roundings (`precise` in GLSL);
* min and max of two non-NaN values return one of them, bits and all (x_exp
  clamps with min(max(x, -104), 89); softmax and attention take row maxima).
  With a NaN operand GLSL leaves min/max undefined and NumPy returns the NaN;
  the shaders never use such a result (x_exp selects x itself when x is NaN;
  softplus adds a NaN to it anyway; a NaN score makes the whole row NaN on
  both sides), so those cases are reported, not required;
* an ordered comparison with a NaN is false (argmax: NaN never wins).

The expected answers are computed here with integers and fractions, not with
the floating-point unit under test, so a process whose FPU flushes denormals
cannot fool its own check.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

NAN = "nan"          # any NaN
ANY = "any"          # not part of the contract: reported only
OPS = ("add", "sub", "mul", "min", "max", "gt", "muladd")
SIGN = 0x80000000
INF_BITS = 0x7F800000


def _parts(b: int):
    return b >> 31, (b >> 23) & 0xFF, b & 0x7FFFFF


def is_nan(b: int) -> bool:
    return (b & 0x7FFFFFFF) > INF_BITS


def is_inf(b: int) -> bool:
    return (b & 0x7FFFFFFF) == INF_BITS


def value(b: int) -> Fraction:
    """The exact value of finite float32 bits (a zero's sign is lost)."""
    s, e, m = _parts(b)
    v = Fraction(m, 1 << 149) if e == 0 else Fraction((1 << 23) | m) * Fraction(2) ** (e - 150)
    return -v if s else v


def round_f32(q: Fraction, negative_zero: bool = False) -> int:
    """float32 bits of q rounded to nearest, ties to even (denormals and
    overflow to inf included); a result of 0 is -0 when negative_zero."""
    sign = SIGN if (q < 0 or (q == 0 and negative_zero)) else 0
    q = abs(q)
    if q == 0:
        return sign
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if q < Fraction(2) ** e:
        e -= 1
    e = max(e, -126)                         # below: the denormal grid, steps of 2**-149
    s = q / Fraction(2) ** (e - 23)
    m, rem = divmod(s.numerator, s.denominator)
    half = Fraction(rem, s.denominator)
    if half > Fraction(1, 2) or (half == Fraction(1, 2) and m & 1):
        m += 1
    if m == 1 << 24:
        m, e = 1 << 23, e + 1
    if m < 1 << 23:                          # a denormal (or zero after rounding)
        return sign | m
    if e + 127 >= 255:
        return sign | INF_BITS
    return sign | ((e + 127) << 23) | (m - (1 << 23))


def bits_of(x) -> int:
    """float32 bits of a number given exactly (int, Fraction or a decimal string)."""
    return round_f32(Fraction(x))


def _add(a: int, b: int):
    if is_nan(a) or is_nan(b):
        return NAN
    if is_inf(a) or is_inf(b):
        if is_inf(a) and is_inf(b) and (a ^ b) & SIGN:
            return NAN
        return a if is_inf(a) else b
    q = value(a) + value(b)
    if q == 0:                                # an exact zero is +0, unless both are -0
        return SIGN if (a == SIGN and b == SIGN) else 0
    return round_f32(q)


def _mul(a: int, b: int):
    if is_nan(a) or is_nan(b):
        return NAN
    sign = (a ^ b) & SIGN
    za, zb = (a & 0x7FFFFFFF) == 0, (b & 0x7FFFFFFF) == 0
    if is_inf(a) or is_inf(b):
        return NAN if (za or zb) else sign | INF_BITS
    return round_f32(value(a) * value(b), negative_zero=bool(sign))


def _order(b: int):
    return (-1 if b & SIGN else 1) * Fraction(10) ** 60 if is_inf(b) else value(b)


def expected(op: str, a: int, b: int, c: int = 0):
    """The exact answer: float32 bits, NAN, or ANY (min/max with a NaN)."""
    if op == "add":
        return _add(a, b)
    if op == "sub":
        return _add(a, b ^ SIGN)
    if op == "mul":
        return _mul(a, b)
    if op == "muladd":
        p = _mul(a, b)
        return NAN if p == NAN else _add(p, c)
    if op in ("min", "max"):
        if is_nan(a) or is_nan(b):
            return ANY
        va, vb = _order(a), _order(b)
        assert va != vb or a == b, "min/max of -0 and +0 has no single answer"
        return (a if va <= vb else b) if op == "min" else (a if va >= vb else b)
    if op == "gt":
        return 0 if is_nan(a) or is_nan(b) else int(_order(a) > _order(b))
    raise ValueError(op)


@dataclass(frozen=True)
class Case:
    name: str
    op: str
    a: int
    b: int
    c: int = 0

    @property
    def want(self):
        return expected(self.op, self.a, self.b, self.c)


class Bits(int):
    """A literal bit pattern among the operands (NaN, -0, inf, the largest float)."""


def _c(name, op, a, b, c=0) -> Case:
    return Case(name, op, *(int(v) if isinstance(v, Bits) else bits_of(v) for v in (a, b, c)))


P = Fraction(2)
NEG0, INF, NINF, QNAN = Bits(SIGN), Bits(INF_BITS), Bits(SIGN | INF_BITS), Bits(0x7FC00000)
MAX = Bits(0x7F7FFFFF)
TINY = P ** -149                       # the smallest denormal

CASES: tuple[Case, ...] = (
    # round to nearest, ties to even
    _c("add rounds a tie to even: 1 + 2^-24 = 1", "add", 1, P ** -24),
    _c("add rounds a tie to even: (1 + 2^-23) + 2^-24 = 1 + 2^-22", "add", 1 + P ** -23, P ** -24),
    _c("add rounds to nearest: 1 + 3*2^-25 = 1 + 2^-23", "add", 1, 3 * P ** -25),
    _c("sub rounds a tie to even: 1 - 2^-25 = 1", "sub", 1, P ** -25),
    _c("mul rounds a tie to even (up): 3 * (1 + 2^-23)", "mul", 3, 1 + P ** -23),
    _c("mul rounds a tie to even (down): 3 * (1 + 3*2^-23)", "mul", 3, 1 + 3 * P ** -23),
    _c("add rounds a tie past the largest float to inf", "add", MAX, P ** 103),
    _c("a*b + c is two roundings, never fused", "muladd", 1 + P ** -12, 1 + P ** -12, -(1 + P ** -11)),
    # denormals: inputs and outputs, gradual underflow
    _c("mul gives a denormal product: 1e-20 * 1e-20", "mul", Fraction("1e-20"), Fraction("1e-20")),
    _c("add keeps a denormal input: 1e-40 + 0", "add", Fraction("1e-40"), 0),
    _c("add of two denormals: 1e-40 + 1e-40", "add", Fraction("1e-40"), Fraction("1e-40")),
    _c("sub of two normals gives a denormal: 1.5*2^-126 - 2^-126", "sub", Fraction(3, 2) * P ** -126, P ** -126),
    _c("mul of a denormal input gives a normal: 1e-40 * 2^30", "mul", Fraction("1e-40"), P ** 30),
    _c("mul rounds a denormal tie to even: 3*2^-149 * 0.5 = 2*2^-149", "mul", 3 * TINY, Fraction(1, 2)),
    _c("mul rounds the smallest denormal's half to +0", "mul", TINY, Fraction(1, 2)),
    _c("mul underflow keeps the sign: -2^-100 * 2^-100 = -0", "mul", -P ** -100, P ** -100),
    # signed zero
    _c("-0 + -0 = -0", "add", NEG0, NEG0),
    _c("-0 + +0 = +0", "add", NEG0, 0),
    _c("+0 - +0 = +0", "sub", 0, 0),
    _c("-0 - +0 = -0", "sub", NEG0, 0),
    _c("x - x = +0", "sub", Fraction(3, 7), Fraction(3, 7)),
    _c("-0 * 1 = -0", "mul", NEG0, 1),
    _c("-1 * +0 = -0", "mul", -1, 0),
    _c("-0 * -0 = +0", "mul", NEG0, NEG0),
    # inf and NaN
    _c("inf + 1 = inf", "add", INF, 1),
    _c("1 - inf = -inf", "sub", 1, INF),
    _c("inf - inf is NaN", "sub", INF, INF),
    _c("0 * inf is NaN", "mul", 0, INF),
    _c("inf * -1 = -inf", "mul", INF, -1),
    _c("mul overflows to inf: 2^127 * 2", "mul", P ** 127, 2),
    _c("mul overflows to -inf: -2^127 * 2", "mul", -P ** 127, 2),
    _c("NaN + 1 is NaN", "add", QNAN, 1),
    _c("NaN * 0 is NaN", "mul", QNAN, 0),
    _c("1 - NaN is NaN", "sub", 1, QNAN),
    # min and max on what the shaders give them
    _c("min(inf, 89) = 89 (exp's clamp)", "min", INF, 89),
    _c("max(-inf, -104) = -104 (exp's clamp)", "max", NINF, -104),
    _c("max(-104, 5) = 5", "max", -104, 5),
    _c("min(89, -3) = -3", "min", 89, -3),
    _c("max(-5, -3) = -3 (a row maximum)", "max", -5, -3),
    _c("max(-inf, -inf) = -inf", "max", NINF, NINF),
    _c("max(1e-40, 0) = 1e-40 (a denormal through max)", "max", Fraction("1e-40"), 0),
    _c("max(NaN, 1)", "max", QNAN, 1),
    _c("max(1, NaN)", "max", 1, QNAN),
    _c("min(NaN, 89)", "min", QNAN, 89),
    # comparisons
    _c("NaN > -inf is false (argmax: NaN never wins)", "gt", QNAN, NINF),
    _c("1 > NaN is false", "gt", 1, QNAN),
    _c("-inf > -inf is false", "gt", NINF, NINF),
    _c("1 > -inf is true", "gt", 1, NINF),
)


def check(got: list[int], cases=CASES) -> tuple[list[str], list[str]]:
    """(failures, notes): each failing case's line, and what the reported-only
    cases gave. ``got``: result bits per case (gt: 0 or 1)."""
    fails, notes = [], []
    for case, g in zip(cases, got):
        want = case.want
        if want == ANY:
            notes.append(f"{case.name} = {describe(g)}")
        elif want == NAN:
            if not is_nan(g):
                fails.append(f"{case.name}: got {describe(g)}")
        elif g != want:
            fails.append(f"{case.name}: got {describe(g, case.op)}, want {describe(want, case.op)}")
    return fails, notes


def describe(b: int, op: str = "") -> str:
    if op == "gt":
        return "true" if b else "false"
    if is_nan(b):
        return "NaN"
    if is_inf(b):
        return "-inf" if b & SIGN else "inf"
    if b & 0x7FFFFFFF == 0:
        return "-0" if b & SIGN else "+0"
    return f"{float(value(b)):.9g} (0x{b:08x})"      # exact value shown; the check compares bits
