// A weight's values from the bytes its file stores: the GLSL twin of
// vkspec/formats/matrix.py's dequantize (formats/ggml.py for GGUF's block
// types, formats/quant.py for int8 and int4-g64), formula for formula. Every
// product below is exact in float32 (a scale's 11-bit significand times a
// few-bit integer), so only the final + m / - dmin * mn rounds, as in the
// definition; `precise` keeps any driver from fusing that one.
//
// The including shader declares `buffer W { uint wq[]; }` (the weight's bytes,
// rows after rows) and `buffer S { float scales[]; }` (int8, int4-g64 and fp8
// keep their scales there), and defines one W_<FORMAT>. A row starts at byte
// rb; its outside scales at s0.
#ifndef VKSPEC_WEIGHTS_GLSL
#define VKSPEC_WEIGHTS_GLSL

uint w_byte(uint o) { return (wq[o >> 2] >> ((o & 3u) << 3)) & 0xffu; }
uint w_u16(uint o) { return (wq[o >> 2] >> ((o & 2u) << 3)) & 0xffffu; }   // o even
uint w_u32(uint o) {                                                         // o even
    uint i = o >> 2, a = wq[i];
    if ((o & 2u) == 0u) return a;
    return (a >> 16) | (wq[i + 1u] << 16);
}
int w_s8(uint b) { return int(b << 24) >> 24; }

// f16 bits widened exactly (formats/ggml.py f16_bits_to_f32)
float w_f16(uint h) {
    uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0u) {
        precise float v = float(m) * 5.9604644775390625e-8;      // m * 2**-24, exact
        return uintBitsToFloat(floatBitsToUint(v) | sign);
    }
    if (e == 31u) return uintBitsToFloat(sign | 0x7f800000u | (m << 13));
    return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}

// e4m3fn bits as float32 (exact): subnormals m * 2**-9, S.1111.111 NaN
float w_fp8(uint b) {
    uint sign = (b & 0x80u) << 24, e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15u && m == 7u) return uintBitsToFloat(sign | 0x7fc00000u);
    if (e == 0u) {
        precise float v = float(m) * 0.001953125;
        return uintBitsToFloat(floatBitsToUint(v) | sign);
    }
    return uintBitsToFloat(sign | ((e + 120u) << 23) | (m << 20));
}

// Q4_K/Q5_K's 6-bit (scale, min) pair j of the 12 bytes at o
uvec2 w_k4(uint o, uint j) {
    if (j < 4u) return uvec2(w_byte(o + j) & 63u, w_byte(o + j + 4u) & 63u);
    return uvec2((w_byte(o + j + 4u) & 15u) | ((w_byte(o + j - 4u) >> 6) << 4),
                 (w_byte(o + j + 4u) >> 4) | ((w_byte(o + j) >> 6) << 4));
}

// Q3_K's 6-bit scale s of the 12 bytes at o, minus 32
int w_q3_scale(uint o, uint s) {
    uint low = s < 8u ? (w_byte(o + s) & 15u) : (w_byte(o + s - 8u) >> 4);
    uint high = (w_byte(o + 8u + (s & 3u)) >> (2u * (s >> 2))) & 3u;
    return int(low | (high << 4)) - 32;
}

float w_value(uint rb, uint s0, uint e) {
#if defined(W_F32)
    return uintBitsToFloat(wq[(rb >> 2) + e]);
#elif defined(W_F16)
    return w_f16(w_u16(rb + 2u * e));
#elif defined(W_BF16)
    return uintBitsToFloat(w_u16(rb + 2u * e) << 16);
#elif defined(W_INT8)
    precise float r = float(w_s8(w_byte(rb + e))) * scales[s0];
    return r;
#elif defined(W_INT4_G64)
    uint b = w_byte(rb + (e >> 1));
    int q = int((e & 1u) != 0u ? b >> 4 : b & 15u) - 8;
    precise float r = float(q) * scales[s0 + (e >> 6)];
    return r;
#elif defined(W_FP8)
    precise float r = w_fp8(w_byte(rb + e)) * scales[s0 + (e >> 7)];
    return r;
#else
    uint j = e & 31u;
#if defined(W_Q4_0)
    uint o = rb + (e >> 5) * 18u;
    uint b = w_byte(o + 2u + (j & 15u));
    precise float r = w_f16(w_u16(o)) * float(int(j < 16u ? b & 15u : b >> 4) - 8);
#elif defined(W_Q4_1)
    uint o = rb + (e >> 5) * 20u;
    uint b = w_byte(o + 4u + (j & 15u));
    precise float r = w_f16(w_u16(o)) * float(j < 16u ? b & 15u : b >> 4) + w_f16(w_u16(o + 2u));
#elif defined(W_Q5_0)
    uint o = rb + (e >> 5) * 22u;
    uint b = w_byte(o + 6u + (j & 15u));
    uint q = (j < 16u ? b & 15u : b >> 4) | (((w_u32(o + 2u) >> j) & 1u) << 4);
    precise float r = w_f16(w_u16(o)) * float(int(q) - 16);
#elif defined(W_Q5_1)
    uint o = rb + (e >> 5) * 24u;
    uint b = w_byte(o + 8u + (j & 15u));
    uint q = (j < 16u ? b & 15u : b >> 4) | (((w_u32(o + 4u) >> j) & 1u) << 4);
    precise float r = w_f16(w_u16(o)) * float(q) + w_f16(w_u16(o + 2u));
#elif defined(W_Q8_0)
    uint o = rb + (e >> 5) * 34u;
    precise float r = float(w_s8(w_byte(o + 2u + j))) * w_f16(w_u16(o));
#else
    uint k = e & 255u, half_ = k >> 7, rest = k & 127u, l = k & 31u;
#if defined(W_Q2_K)
    uint o = rb + (e >> 8) * 84u;
    uint s = w_byte(o + (k >> 4));
    uint q = (w_byte(o + 16u + 32u * half_ + l) >> (2u * (rest >> 5))) & 3u;
    precise float r = (w_f16(w_u16(o + 80u)) * float(s & 15u)) * float(q)
                      - w_f16(w_u16(o + 82u)) * float(s >> 4);
#elif defined(W_Q3_K)
    uint o = rb + (e >> 8) * 110u, pas = rest >> 5;
    int low = int((w_byte(o + 32u + 32u * half_ + l) >> (2u * pas)) & 3u);
    uint hbit = (w_byte(o + l) >> (4u * half_ + pas)) & 1u;
    int q = low - (hbit != 0u ? 0 : 4);
    precise float r = (w_f16(w_u16(o + 108u)) * float(w_q3_scale(o + 96u, k >> 4))) * float(q);
#elif defined(W_Q4_K) || defined(W_Q5_K)
    uint chunk = k >> 6, nib = (k >> 5) & 1u;
#if defined(W_Q4_K)
    uint o = rb + (e >> 8) * 144u;
    uint q = (w_byte(o + 16u + 32u * chunk + l) >> (4u * nib)) & 15u;
#else
    uint o = rb + (e >> 8) * 176u;
    uint q = ((w_byte(o + 48u + 32u * chunk + l) >> (4u * nib)) & 15u)
             | (((w_byte(o + 16u + l) >> (2u * chunk + nib)) & 1u) << 4);
#endif
    uvec2 sm = w_k4(o + 4u, k >> 5);
    precise float r = (w_f16(w_u16(o)) * float(sm.x)) * float(q) - w_f16(w_u16(o + 2u)) * float(sm.y);
#elif defined(W_Q6_K)
    uint o = rb + (e >> 8) * 210u, kk = rest >> 5;
    uint lo = (w_byte(o + 64u * half_ + 32u * (kk & 1u) + l) >> (4u * (kk >> 1))) & 15u;
    uint hi = (w_byte(o + 128u + 32u * half_ + l) >> (2u * kk)) & 3u;
    precise float r = (w_f16(w_u16(o + 208u)) * float(w_s8(w_byte(o + 192u + (k >> 4)))))
                      * float(int(lo | (hi << 4)) - 32);
#else
#error "define one W_<format>"
#endif
#endif
    return r;
#endif
}

#define W_BYTE_OF(u, i) (((u) >> (8u * (i))) & 0xffu)

// The 4 values of a 4- or 5-bit block format's quants: low 4 bits in the
// bytes of u, the 5th bits (Q5_0, Q5_1) in qh's low 4 bits; scale d, min m.
#if defined(W_Q4_0) || defined(W_Q4_1) || defined(W_Q5_0) || defined(W_Q5_1)
vec4 w_q4_q5(uint u, uint qh, float d, float m) {
    vec4 v;
    for (uint i = 0u; i < 4u; i++) {
        uint q = (u >> (8u * i)) & 15u;
#if defined(W_Q4_0)
        precise float r = d * float(int(q) - 8);
#elif defined(W_Q4_1)
        precise float r = d * float(q) + m;
#elif defined(W_Q5_0)
        q |= ((qh >> i) & 1u) << 4;
        precise float r = d * float(int(q) - 16);
#else
        q |= ((qh >> i) & 1u) << 4;
        precise float r = d * float(q) + m;
#endif
        v[i] = r;
    }
    return v;
}
#endif

// Columns e..e+3 (e a multiple of 4) of the row at rb: w_value of each, bit
// for bit, with the block's header read once. The 4 columns always share one
// block (and one sub-block scale: blocks and sub-blocks are multiples of 4
// columns), and their 4 quant bytes lie at an even offset, so one w_u32 reads them.
vec4 w_vec4(uint rb, uint s0, uint e) {
    vec4 v;
#if defined(W_F32)
    uint i = (rb >> 2) + e;
    v = uintBitsToFloat(uvec4(wq[i], wq[i + 1u], wq[i + 2u], wq[i + 3u]));
#elif defined(W_F16)
    uint a = w_u32(rb + 2u * e), b = w_u32(rb + 2u * e + 4u);
    v = vec4(w_f16(a & 0xffffu), w_f16(a >> 16), w_f16(b & 0xffffu), w_f16(b >> 16));
#elif defined(W_BF16)
    uint a = w_u32(rb + 2u * e), b = w_u32(rb + 2u * e + 4u);
    v = uintBitsToFloat(uvec4(a << 16, a & 0xffff0000u, b << 16, b & 0xffff0000u));
#elif defined(W_INT4_G64)
    uint h = w_u16(rb + (e >> 1));
    float s = scales[s0 + (e >> 6)];
    for (uint i = 0u; i < 4u; i++) {
        precise float r = float(int((h >> (4u * i)) & 15u) - 8) * s;
        v[i] = r;
    }
#elif defined(W_INT8) || defined(W_FP8)
    uint u = w_u32(rb + e);
#if defined(W_INT8)
    float s = scales[s0];
#else
    float s = scales[s0 + (e >> 7)];
#endif
    for (uint i = 0u; i < 4u; i++) {
#if defined(W_INT8)
        precise float r = float(w_s8(W_BYTE_OF(u, i))) * s;
#else
        precise float r = w_fp8(W_BYTE_OF(u, i)) * s;
#endif
        v[i] = r;
    }
#else
    uint j = e & 31u;
#if defined(W_Q4_0) || defined(W_Q4_1) || defined(W_Q5_0) || defined(W_Q5_1)
#if defined(W_Q4_0)
    uint o = rb + (e >> 5) * 18u, qs = 2u;
#elif defined(W_Q4_1)
    uint o = rb + (e >> 5) * 20u, qs = 4u;
#elif defined(W_Q5_0)
    uint o = rb + (e >> 5) * 22u, qs = 6u;
    uint qh = w_u32(o + 2u) >> j;
#else
    uint o = rb + (e >> 5) * 24u, qs = 8u;
    uint qh = w_u32(o + 4u) >> j;
#endif
    uint u = w_u32(o + qs + (j & 15u)) >> (j < 16u ? 0u : 4u);
    float d = w_f16(w_u16(o)), m = 0.0;
#if defined(W_Q4_1) || defined(W_Q5_1)
    m = w_f16(w_u16(o + 2u));
#endif
#if defined(W_Q4_0) || defined(W_Q4_1)
    uint qh = 0u;
#endif
    v = w_q4_q5(u, qh, d, m);
#elif defined(W_Q8_0)
    uint o = rb + (e >> 5) * 34u;
    uint u = w_u32(o + 2u + j);
    float d = w_f16(w_u16(o));
    for (uint i = 0u; i < 4u; i++) {
        precise float r = float(w_s8(W_BYTE_OF(u, i))) * d;
        v[i] = r;
    }
#else
    uint k = e & 255u, half_ = k >> 7, rest = k & 127u, l = k & 31u;
#if defined(W_Q2_K)
    uint o = rb + (e >> 8) * 84u;
    uint s = w_byte(o + (k >> 4));
    uint u = w_u32(o + 16u + 32u * half_ + l) >> (2u * (rest >> 5));
    precise float dl = w_f16(w_u16(o + 80u)) * float(s & 15u);
    precise float ml = w_f16(w_u16(o + 82u)) * float(s >> 4);
    for (uint i = 0u; i < 4u; i++) {
        precise float r = dl * float((u >> (8u * i)) & 3u) - ml;
        v[i] = r;
    }
#elif defined(W_Q3_K)
    uint o = rb + (e >> 8) * 110u, pas = rest >> 5;
    uint lo = w_u32(o + 32u + 32u * half_ + l) >> (2u * pas);
    uint hb = w_u32(o + l) >> (4u * half_ + pas);
    precise float dl = w_f16(w_u16(o + 108u)) * float(w_q3_scale(o + 96u, k >> 4));
    for (uint i = 0u; i < 4u; i++) {
        int q = int((lo >> (8u * i)) & 3u) - (((hb >> (8u * i)) & 1u) != 0u ? 0 : 4);
        precise float r = dl * float(q);
        v[i] = r;
    }
#elif defined(W_Q4_K) || defined(W_Q5_K)
    uint chunk = k >> 6, nib = (k >> 5) & 1u;
#if defined(W_Q4_K)
    uint o = rb + (e >> 8) * 144u;
    uint u = w_u32(o + 16u + 32u * chunk + l) >> (4u * nib);
#else
    uint o = rb + (e >> 8) * 176u;
    uint u = w_u32(o + 48u + 32u * chunk + l) >> (4u * nib);
    uint hb = w_u32(o + 16u + l) >> (2u * chunk + nib);
#endif
    uvec2 sm = w_k4(o + 4u, k >> 5);
    precise float dl = w_f16(w_u16(o)) * float(sm.x);
    precise float ml = w_f16(w_u16(o + 2u)) * float(sm.y);
    for (uint i = 0u; i < 4u; i++) {
        uint q = (u >> (8u * i)) & 15u;
#if defined(W_Q5_K)
        q |= ((hb >> (8u * i)) & 1u) << 4;
#endif
        precise float r = dl * float(q) - ml;
        v[i] = r;
    }
#elif defined(W_Q6_K)
    uint o = rb + (e >> 8) * 210u, kk = rest >> 5;
    uint lo = w_u32(o + 64u * half_ + 32u * (kk & 1u) + l) >> (4u * (kk >> 1));
    uint hi = w_u32(o + 128u + 32u * half_ + l) >> (2u * kk);
    precise float dl = w_f16(w_u16(o + 208u)) * float(w_s8(w_byte(o + 192u + (k >> 4))));
    for (uint i = 0u; i < 4u; i++) {
        uint q = ((lo >> (8u * i)) & 15u) | (((hi >> (8u * i)) & 3u) << 4);
        precise float r = dl * float(int(q) - 32);
        v[i] = r;
    }
#else
#error "define one W_<format>"
#endif
#endif
#endif
    return v;
}

// Columns e..e+31 (e a multiple of 32, below cols) of the row at rb, as 8
// vec4s: v[t] is w_vec4(rb, s0, e + 4t) bit for bit (a zero vec4 past cols).
// The 32-column block formats read their block's words once here, not once
// per vec4: Lavapipe (Mesa 22) turns every storage buffer load into a loop
// over the SIMD lanes, so the count of loads, not of bytes, sets its speed.
#if defined(W_Q4_0) || defined(W_Q4_1) || defined(W_Q5_0) || defined(W_Q5_1) || defined(W_Q8_0)
#if defined(W_Q4_0)
#define W_BLOCK_BYTES 18u
#elif defined(W_Q4_1)
#define W_BLOCK_BYTES 20u
#elif defined(W_Q5_0)
#define W_BLOCK_BYTES 22u
#elif defined(W_Q5_1)
#define W_BLOCK_BYTES 24u
#else
#define W_BLOCK_BYTES 34u
#endif
// words of the block's bytes from byte 0 (a block starts at an even byte)
#define W_BLOCK_WORDS ((W_BLOCK_BYTES + 3u) / 4u)
#define W_BW16(b) ((bw[(b) >> 2] >> (((b) & 2u) << 3)) & 0xffffu)
#define W_BW32(b) (((b) & 2u) == 0u ? bw[(b) >> 2] : (bw[(b) >> 2] >> 16) | (bw[((b) >> 2) + 1u] << 16))
#endif

#if defined(W_Q4_0) || defined(W_Q4_1) || defined(W_Q5_0) || defined(W_Q5_1) || defined(W_Q8_0)
// The bytes of the block at byte o (even) as words from its byte 0, each
// word of the buffer read once (W_BW16, W_BW32 read them); its scale d and
// min m (0 where the format has none).
void w_block_words(uint o, out uint bw[W_BLOCK_WORDS + 1u], out float d, out float m) {
    uint i0 = o >> 2;
    bool odd = (o & 2u) != 0u;
    // the aligned words that hold the block: one more when a block of 20 or 24
    // bytes starts mid-word (one of 18, 22 or 34 bytes fits either way)
    uint a[W_BLOCK_WORDS + 1u];
    for (uint k = 0u; k < W_BLOCK_WORDS; k++) a[k] = wq[i0 + k];
    a[W_BLOCK_WORDS] = 0u;
    if ((W_BLOCK_BYTES & 2u) == 0u && odd) a[W_BLOCK_WORDS] = wq[i0 + W_BLOCK_WORDS];
    for (uint k = 0u; k < W_BLOCK_WORDS; k++) bw[k] = odd ? (a[k] >> 16) | (a[k + 1u] << 16) : a[k];
    bw[W_BLOCK_WORDS] = 0u;
    d = w_f16(W_BW16(0u));
    m = 0.0;
#if defined(W_Q4_1) || defined(W_Q5_1)
    m = w_f16(W_BW16(2u));
#endif
}
#endif

void w_block32(uint rb, uint s0, uint e, uint cols, out vec4 v[8]) {
#if defined(W_Q4_0) || defined(W_Q4_1) || defined(W_Q5_0) || defined(W_Q5_1) || defined(W_Q8_0)
    uint bw[W_BLOCK_WORDS + 1u];
    float d, m;
    w_block_words(rb + (e >> 5) * W_BLOCK_BYTES, bw, d, m);
    for (uint t = 0u; t < 8u; t++) {
        uint j = 4u * t;
#if defined(W_Q8_0)
        uint u = W_BW32(2u + j);
        for (uint i = 0u; i < 4u; i++) {
            precise float r = float(w_s8(W_BYTE_OF(u, i))) * d;
            v[t][i] = r;
        }
#else
#if defined(W_Q4_0)
        uint qh = 0u, u = W_BW32(2u + (j & 15u)) >> (j < 16u ? 0u : 4u);
#elif defined(W_Q4_1)
        uint qh = 0u, u = W_BW32(4u + (j & 15u)) >> (j < 16u ? 0u : 4u);
#elif defined(W_Q5_0)
        uint qh = W_BW32(2u) >> j;
        uint u = W_BW32(6u + (j & 15u)) >> (j < 16u ? 0u : 4u);
#else
        uint qh = W_BW32(4u) >> j;
        uint u = W_BW32(8u + (j & 15u)) >> (j < 16u ? 0u : 4u);
#endif
        v[t] = w_q4_q5(u, qh, d, m);
#endif
    }
#else
    for (uint t = 0u; t < 8u; t++) v[t] = e + 4u * t < cols ? w_vec4(rb, s0, e + 4u * t) : vec4(0.0);
#endif
}

#endif
