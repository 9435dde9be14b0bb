// A block-format weight as integers: the GLSL twin of formats/intform.py,
// read from the same bytes as weights.glsl. Element e of float block b has
// the value d * sc * (q - z) [+ m | - dmin * mn], with (q - z) held as
// signed bytes, 4 to a word (every format's q - z is within [-128, 127]):
//   wi_block32  a 32-column block's 8 words, d and m (sc = 1);
//   wi_word, wi_scale, wi_d, wi_min  a K-quant's words for columns e..e+3,
//               sub-block scale sc, d and dmin;
//   wi_min_term the integer min term of the "_1" formats and Q2_K/Q4_K/Q5_K.
// The integer sums are exact in any order, so how the columns are grouped
// does not matter; only exact.q8_combine's float order does.
// The includer defines one W_<FORMAT> of formats.intform.Q8_FORMATS and
// includes weights.glsl (w_byte, w_u16, w_u32, w_f16, w_k4, w_q3_scale).
#ifndef VKSPEC_WEIGHTS_INT_GLSL
#define VKSPEC_WEIGHTS_INT_GLSL

#if defined(W_Q2_K) || defined(W_Q3_K) || defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K)
#define QB 256u                 // columns of a float block (formats.intform.block_size)
#define QB_32 0
#else
#define QB 32u
#define QB_32 1
#endif

#if defined(W_INT8)
#define WI_BLOCK_BYTES 32u
#elif defined(W_INT4_G64)
#define WI_BLOCK_BYTES 16u
#elif defined(W_Q4_0)
#define WI_BLOCK_BYTES 18u
#elif defined(W_Q4_1)
#define WI_BLOCK_BYTES 20u
#elif defined(W_Q5_0)
#define WI_BLOCK_BYTES 22u
#elif defined(W_Q5_1)
#define WI_BLOCK_BYTES 24u
#elif defined(W_Q8_0)
#define WI_BLOCK_BYTES 34u
#elif defined(W_Q2_K)
#define WI_BLOCK_BYTES 84u
#elif defined(W_Q3_K)
#define WI_BLOCK_BYTES 110u
#elif defined(W_Q4_K)
#define WI_BLOCK_BYTES 144u
#elif defined(W_Q5_K)
#define WI_BLOCK_BYTES 176u
#elif defined(W_Q6_K)
#define WI_BLOCK_BYTES 210u
#else
#error "weights_int.glsl: define one W_<format> that q8 applies to"
#endif

#if defined(W_Q4_1) || defined(W_Q5_1)
#define WI_MIN 1                // + m * (the block's activation sum)
#elif defined(W_Q2_K) || defined(W_Q4_K) || defined(W_Q5_K)
#define WI_MIN -1               // - dmin * (sum of mn * each 16 columns' activation sum)
#endif

// bytes v in [0, 2z) minus z, as signed bytes: v + 128 - z stays below 256
// in every byte (no carry), and flipping bit 7 subtracts 128
uint wi_sub(uint v, uint z) { return (v + (128u - z) * 0x01010101u) ^ 0x80808080u; }

// bit i of the 4 low bits of h to bit 0 of byte i
uint wi_spread4(uint h) { return (h & 1u) | ((h & 2u) << 7) | ((h & 4u) << 14) | ((h & 8u) << 21); }

// the 4 low nibbles of h as bytes, minus 8 (int4-g64's columns, in order)
uint wi_nibbles4(uint h) {
    return wi_sub((h & 15u) | ((h & 0xf0u) << 4) | ((h & 0xf00u) << 8) | ((h & 0xf000u) << 12), 8u);
}

#if QB_32
// The 32 values (q - z) of the block at byte o as 8 words (w[t]: columns
// 4t..4t+3), its d and its min m (0 where there is none), the block's
// bytes read once (on Lavapipe the count of loads sets the speed).
void wi_block32(uint o, uint s0, uint b, out uint w[8], out float d, out float m) {
    m = 0.0;
#if defined(W_INT8)
    for (uint t = 0u; t < 8u; t++) w[t] = wq[(o >> 2) + t];
    d = scales[s0];
#elif defined(W_INT4_G64)
    for (uint k = 0u; k < 4u; k++) {                 // a word: columns 8k..8k+7, two to a byte
        uint u = wq[(o >> 2) + k];
        w[2u * k] = wi_nibbles4(u & 0xffffu);
        w[2u * k + 1u] = wi_nibbles4(u >> 16);
    }
    d = scales[s0 + (b >> 1)];
#else
    uint bw[W_BLOCK_WORDS + 1u];
    w_block_words(o, bw, d, m);
    for (uint t = 0u; t < 8u; t++) {
        uint j = 4u * t;
#if defined(W_Q8_0)
        w[t] = W_BW32(2u + j);
#else
#if defined(W_Q4_0)
        uint qs = 2u;
#elif defined(W_Q4_1)
        uint qs = 4u;
#elif defined(W_Q5_0)
        uint qs = 6u;
#else
        uint qs = 8u;
#endif
        uint v = (W_BW32(qs + (j & 15u)) >> (j < 16u ? 0u : 4u)) & 0x0f0f0f0fu;
#if defined(W_Q5_0)
        v = wi_sub(v | (wi_spread4(W_BW32(2u) >> j) << 4), 16u);
#elif defined(W_Q5_1)
        v |= wi_spread4(W_BW32(4u) >> j) << 4;
#elif defined(W_Q4_0)
        v = wi_sub(v, 8u);
#endif
        w[t] = v;
#endif
    }
#endif
}
#else
// columns e..e+3 of the K-quant block at byte o (e a multiple of 4, below 256)
uint wi_word(uint o, uint e) {
    uint half_ = e >> 7, rest = e & 127u, l = e & 31u;
#if defined(W_Q2_K)
    return (w_u32(o + 16u + 32u * half_ + l) >> (2u * (rest >> 5))) & 0x03030303u;
#elif defined(W_Q3_K)
    uint pas = rest >> 5;
    uint lo = (w_u32(o + 32u + 32u * half_ + l) >> (2u * pas)) & 0x03030303u;
    uint hb = (w_u32(o + l) >> (4u * half_ + pas)) & 0x01010101u;
    return wi_sub(lo | (hb << 2), 4u);
#elif defined(W_Q4_K) || defined(W_Q5_K)
    uint chunk = e >> 6, nib = (e >> 5) & 1u;
#if defined(W_Q4_K)
    return (w_u32(o + 16u + 32u * chunk + l) >> (4u * nib)) & 0x0f0f0f0fu;
#else
    return ((w_u32(o + 48u + 32u * chunk + l) >> (4u * nib)) & 0x0f0f0f0fu)
           | (((w_u32(o + 16u + l) >> (2u * chunk + nib)) & 0x01010101u) << 4);
#endif
#else
    uint kk = rest >> 5;
    uint lo = (w_u32(o + 64u * half_ + 32u * (kk & 1u) + l) >> (4u * (kk >> 1))) & 0x0f0f0f0fu;
    uint hi = (w_u32(o + 128u + 32u * half_ + l) >> (2u * kk)) & 0x03030303u;
    return wi_sub(lo | (hi << 4), 32u);
#endif
}

// d of the K-quant block at byte o
float wi_d(uint o) {
#if defined(W_Q2_K)
    return w_f16(w_u16(o + 80u));
#elif defined(W_Q3_K)
    return w_f16(w_u16(o + 108u));
#elif defined(W_Q6_K)
    return w_f16(w_u16(o + 208u));
#else
    return w_f16(w_u16(o));
#endif
}
#endif

#if !QB_32
// the sub-block scale of columns e..e+15 of the K-quant block at o
int wi_scale(uint o, uint e) {
#if defined(W_Q2_K)
    return int(w_byte(o + (e >> 4)) & 15u);
#elif defined(W_Q3_K)
    return w_q3_scale(o + 96u, e >> 4);
#elif defined(W_Q4_K) || defined(W_Q5_K)
    return int(w_k4(o + 4u, e >> 5).x);
#else
    return w_s8(w_byte(o + 192u + (e >> 4)));
#endif
}
#endif

#ifdef WI_MIN
// The K-quant block's dmin, and a block's integer min term for one
// activation row whose 16-column sums start at word `sums` of the q8 rows (qw): the
// block's whole sum ("_1"), or the sum of mn * each 16 columns' sum.
#if !QB_32
float wi_min(uint o) {
#if defined(W_Q2_K)
    return w_f16(w_u16(o + 82u));
#else
    return w_f16(w_u16(o + 2u));
#endif
}
#endif

int wi_min_term(uint o, uint sums) {
#if defined(W_Q4_1) || defined(W_Q5_1)
    return int(qw(sums)) + int(qw(sums + 1u));
#elif defined(W_Q2_K)
    int t = 0;
    for (uint g = 0u; g < 16u; g++) t += int(w_byte(o + g) >> 4) * int(qw(sums + g));
    return t;
#else
    int t = 0;
    for (uint j = 0u; j < 8u; j++)
        t += int(w_k4(o + 4u, j).y) * (int(qw(sums + 2u * j)) + int(qw(sums + 2u * j + 1u)));
    return t;
#endif
}
#endif

// the sum of the 4 signed-byte products of two words
int wi_dot4(uint a, uint b) {
    ivec4 x = ivec4(int(a << 24) >> 24, int(a << 16) >> 24, int(a << 8) >> 24, int(a) >> 24);
    ivec4 y = ivec4(int(b << 24) >> 24, int(b << 16) >> 24, int(b << 8) >> 24, int(b) >> 24);
    return x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
}

#endif
