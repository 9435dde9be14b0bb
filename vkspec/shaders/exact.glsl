// The exact arithmetic core, GLSL side: the twin of vkspec/exact.py.
// Every function performs the same float32 operations in the same order as
// its NumPy namesake (x_exp <-> exact.exp, ...). Only + - * on floats (Vulkan
// rounds those correctly), exact bit manipulation and floor. Every float that
// carries arithmetic is `precise`, so no driver may fuse a*b+c; fma() and
// subgroup operations are never used.
#ifndef VKSPEC_EXACT_GLSL
#define VKSPEC_EXACT_GLSL

#define REDUCE_LANES 32u
#define REDUCE_STRIDE 128u

bool x_is_nan(uint b) { return (b & 0x7fffffffu) > 0x7f800000u; }
bool x_is_zero(uint b) { return (b & 0x7fffffffu) == 0u; }
bool x_is_zero_or_denormal(uint b) { return (b & 0x7f800000u) == 0u; }
float x_pow2(int e) { return uintBitsToFloat(uint(e + 127) << 23); }
#define X_INF uintBitsToFloat(0x7f800000u)
#define X_NAN uintBitsToFloat(0x7fc00000u)

// y * 2**e for e in [-252, 254]: one exact step, then one rounding.
float x_scale(float y, int e) {
    int e1 = e >> 1;
    precise float r = (y * x_pow2(e1)) * x_pow2(e - e1);
    return r;
}

// (a * 2**24, 24) for a denormal a, else (a, 0).
float x_unsubnormal(float a, out int k) {
    uint b = floatBitsToUint(a);
    bool sub = x_is_zero_or_denormal(b) && (b & 0x007fffffu) != 0u;
    k = sub ? 24 : 0;
    precise float r = a * 16777216.0;
    return sub ? r : a;
}

float x_exp(float x) {
    precise float xc = min(max(x, -104.0), 89.0);
    precise float n = floor(xc * 1.44269504088896341 + 0.5);
    precise float r = xc - n * 0.693359375;
    r = r - n * -2.12194440e-4;
    precise float p = 1.9875691500e-4;
    p = p * r + 1.3981999507e-3;
    p = p * r + 8.3334519073e-3;
    p = p * r + 4.1665795894e-2;
    p = p * r + 1.6666665459e-1;
    p = p * r + 5.0000001201e-1;
    p = (p * (r * r) + r) + 1.0;
    precise float y = x_scale(p, int(n));
    return x_is_nan(floatBitsToUint(x)) ? x : y;
}

float x_log(float x) {
    int k;
    precise float xn = x_unsubnormal(x, k);
    uint b = floatBitsToUint(xn);
    int e = int(b >> 23) - 126 - k;
    precise float m = uintBitsToFloat((b & 0x007fffffu) | 0x3f000000u);
    bool small = m < 0.707106781186547524;
    e = small ? e - 1 : e;
    precise float m2 = (m + m) - 1.0;
    precise float m1 = m - 1.0;
    m = small ? m2 : m1;
    precise float z = m * m;
    precise float y = 7.0376836292e-2;
    y = y * m + -1.1514610310e-1;
    y = y * m + 1.1676998740e-1;
    y = y * m + -1.2420140846e-1;
    y = y * m + 1.4249322787e-1;
    y = y * m + -1.6668057665e-1;
    y = y * m + 2.0000714765e-1;
    y = y * m + -2.4999993993e-1;
    y = y * m + 3.3333331174e-1;
    y = (y * m) * z;
    precise float fe = float(e);
    y = y + fe * -2.12194440e-4;
    y = y + z * -0.5;
    precise float r = m + y;
    r = r + fe * 0.693359375;
    bool neg = (b >> 31) == 1u;
    r = x_is_zero(b) ? -X_INF : r;
    r = b == 0x7f800000u ? X_INF : r;
    r = (neg && !x_is_zero(b)) ? X_NAN : r;
    return x_is_nan(b) ? x : r;
}

float x_recip(float a) {
    int k;
    precise float an = x_unsubnormal(a, k);
    uint b = floatBitsToUint(an);
    uint sign = b & 0x80000000u;
    int e = int((b >> 23) & 0xffu);
    precise float m = uintBitsToFloat((b & 0x007fffffu) | 0x3f000000u);
    precise float y = 2.823529411764706 - 1.8823529411764706 * m;
    for (int i = 0; i < 3; i++) {
        y = y + y * (1.0 - m * y);
    }
    precise float r = x_scale(y, 126 - e + k);
    r = x_is_zero(b) ? X_INF : r;
    r = e == 255 ? 0.0 : r;
    r = uintBitsToFloat(floatBitsToUint(r) | sign);
    return x_is_nan(b) ? a : r;
}

float x_rsqrt(float a) {
    int k;
    precise float an = x_unsubnormal(a, k);
    uint b = floatBitsToUint(an);
    precise float y = uintBitsToFloat(0x5f3759dfu - (b >> 1));
    for (int i = 0; i < 3; i++) {
        precise float t = (an * y) * y;
        y = y + y * (0.5 - 0.5 * t);
    }
    y = y * x_pow2(k >> 1);
    precise float r = x_is_zero(b) ? X_INF : y;
    r = (b & 0x7fffffffu) == 0x7f800000u ? 0.0 : r;
    bool neg = (b >> 31) == 1u && !x_is_zero(b);
    r = neg ? X_NAN : r;
    return x_is_nan(b) ? a : r;
}

float x_sigmoid(float x) {
    precise float d = 1.0 + x_exp(-x);
    return x_recip(d);
}

float x_silu(float x) {
    precise float r = x * x_sigmoid(x);
    return r;
}

// GELU (tanh approximation) as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
float x_gelu_tanh(float x) {
    precise float u = 0.7978845608028654 * (x + 0.044715 * ((x * x) * x));
    precise float r = x * x_sigmoid(u + u);
    return r;
}

float x_log1p(float u) {
    precise float w = 1.0 + u;
    precise float wm1 = w - 1.0;
    precise float q = u * x_recip(wm1);
    precise float r = x_log(w) * q;
    return w == 1.0 ? u : r;
}

float x_softplus(float x) {
    precise float y = max(x, 0.0) + x_log1p(x_exp(-abs(x)));
    return x > 20.0 ? x : y;
}

// Lanes of a reduction fold as (x + y) + (z + w).
float x_fold4(vec4 a) {
    precise float r = (a.x + a.y) + (a.z + a.w);
    return r;
}

// The lane tree (lane l += lane l + s for s = 16, 8, .., 1) computed by one
// invocation: lanes are visited in bit-reversed order, so each pair the tree
// joins is adjacent, and a stack joins them (earlier lane on the left).
// Usage: X_TREE_DECL(st, sp); for i in 0..31 { lane = x_tree_lane(i);
// ...; X_TREE_PUSH(st, sp, i, value); } result = st[0].
uint x_tree_lane(uint i) { return bitfieldReverse(i) >> 27; }
#define X_TREE_DECL(st, sp) float st[6]; uint sp = 0u
#define X_TREE_PUSH(st, sp, i, value) {                         \
        st[sp] = (value); sp++;                                  \
        for (uint j_ = (i) + 1u; (j_ & 1u) == 0u; j_ >>= 1) {    \
            precise float t_ = st[sp - 2u] + st[sp - 1u];        \
            sp--; st[sp - 1u] = t_;                              \
        }                                                        \
    }


// result = the canonical sum over columns 0..cols-1 (cols padded to a
// multiple of 128) of TERM4(c), the vec4 of columns c..c+3; TERM4 must give
// zeros past the real columns, as NumPy's zero padding does.
#define X_REDUCE_ROW(result, cols, TERM4) X_REDUCE_ROW_FROM(result, 0u, cols, TERM4)

// The same sum with the steps before column `first` (a multiple of 128) left
// out: where TERM4 would give zeros there, the result is the same (a lane
// starts at +0 and adding +0 changes nothing), and nothing there is read.
#define X_REDUCE_ROW_FROM(result, first, cols, TERM4) {                         \
        X_TREE_DECL(st_, sp_);                                                  \
        for (uint i_ = 0u; i_ < REDUCE_LANES; i_++) {                           \
            uint l_ = x_tree_lane(i_);                                          \
            precise vec4 a_ = vec4(0.0);                                        \
            for (uint c_ = (first) + l_ * 4u; c_ < (cols); c_ += REDUCE_STRIDE) { \
                a_ = a_ + TERM4(c_);                                            \
            }                                                                   \
            X_TREE_PUSH(st_, sp_, i_, x_fold4(a_));                             \
        }                                                                       \
        result = st_[0];                                                        \
    }

uint x_padded(uint n) { return (n + REDUCE_STRIDE - 1u) / REDUCE_STRIDE * REDUCE_STRIDE; }

#endif
