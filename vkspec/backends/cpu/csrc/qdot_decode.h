/* One weight row of a block format decoded for the q8 dot (qdot.c): values as bytes (unsigned
 * with the format's zero point, or signed for Q8_0 / int8), integer sub-block scales and mins,
 * the float block scales; the same fields formats/intform.py reads, from the same bytes. Decoders
 * write each vector with one store, so the dot's loads of it are forwarded. */
#ifndef VKSPEC_QDOT_DECODE_H
#define VKSPEC_QDOT_DECODE_H

static const int BLOCK_BYTES[] = {18, 20, 22, 24, 34, 32, 16, 84, 110, 144, 176, 210};

static inline float from_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t to_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

/* formats/ggml.py f16_bits_to_f32: exact widening, subnormals by one product */
static float f16(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
#if defined(__F16C__)
    return _cvtsh_ss((unsigned short)h);    /* the same value; a signalling NaN comes back quiet (payloads aside) */
#endif
    uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (e == 0) return from_bits(to_bits((float)man * 5.9604644775390625e-08f) | sign);
    if (e == 31) return from_bits(sign | 0x7F800000u | (man << 13));
    return from_bits(sign | ((e + 112u) << 23) | (man << 13));
}


/* ---- one weight row decoded --------------------------------------------------------- */

typedef struct {
    uint8_t *u;         /* cols bytes: unsigned value + zero point, or signed (Q8_0, int8) */
    float *dw, *mw;     /* per float block: d (or dmin's partner) and m / dmin */
    int8_t *sc, *mn;    /* K-quants (plain C): scale and min per 16 columns (Q6_K's signed scales fit) */
    const uint8_t *raw; /* the row's own bytes: vector builds read K-quants from them into registers */
    int fmt, block_bytes;
} Row;

static int zero_point(int f) {
    switch (f) {
    case F_Q4_0: case F_INT4G64: return 8;
    case F_Q5_0: return 16;
    case F_Q6_K: return 32;
    case F_Q3_K: return 4;
    default: return 0;
    }
}

static inline int has_mins(int f) {
    return f == F_Q4_1 || f == F_Q5_1 || f == F_Q2_K || f == F_Q4_K || f == F_Q5_K;
}

/* Q4_K/Q5_K's eight 6-bit (scale, min) pairs in 12 bytes (formats/ggml.py _k4_scales_mins),
 * four at a time as the bytes of a little-endian word: scales 0-7, then mins 0-7 */
static inline void k4_words(const uint8_t *s, uint32_t *v) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4); memcpy(&w1, s + 4, 4); memcpy(&w2, s + 8, 4);
    v[0] = w0 & 0x3F3F3F3Fu;
    v[1] = (w2 & 0x0F0F0F0Fu) | (((w0 >> 6) & 0x03030303u) << 4);
    v[2] = w1 & 0x3F3F3F3Fu;
    v[3] = ((w2 >> 4) & 0x0F0F0F0Fu) | (((w1 >> 6) & 0x03030303u) << 4);
}

#if defined(__AVX2__)
/* the lines of the `bytes` after p + AHEAD into L1 ahead of a dot of several activation rows,
 * whose arithmetic per weight byte leaves the hardware prefetcher behind (8 rows of the 1.7B-width
 * Q4_K_M file 0.82-0.84x the time with it). One row: on the Zen 4 guest it streamed as fast or
 * faster without it (Q8_0 and Q6_K 1.06-1.10x the time with it), on the AVX2-only Zen 3 guest
 * slower (every K-quant and 32-column format 0.80-0.96x the time with it), so builds without
 * AVX-512 prefetch for one row too (PREFETCH_ONE). A bit-neutral hint. Always inlined: GCC took
 * the function, out of line, for one without effects and deleted every call (the library held no
 * prefetch instruction until this was seen) */
enum { AHEAD = 2048 };
#if defined(__AVX512F__)
enum { PREFETCH_ONE = 0 };
#else
enum { PREFETCH_ONE = 1 };
#endif
static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + AHEAD + o, _MM_HINT_T0);
}

/* four words as one register without a trip through memory (four 4-byte stores read back by one
 * 16-byte load do not forward: measured a quarter of a Q3_K GEMV) */
static inline __m128i words4(const uint32_t *v) {
    return _mm_setr_epi32((int)v[0], (int)v[1], (int)v[2], (int)v[3]);
}
#endif

#if !defined(__AVX2__)
/* plain builds decode K-quant rows into bytes (vector builds hold them in registers: rows_k) */
static void k4_scales(const uint8_t *s, int8_t *sc, int8_t *mn) {      /* each pair widened to its two groups */
    uint32_t v[4];
    uint8_t b[16];
    k4_words(s, v);
    memcpy(b, v, 16);
    for (int g = 0; g < 16; g++) { sc[g] = (int8_t)b[g / 2]; mn[g] = (int8_t)b[8 + g / 2]; }
}

/* u[l] = ((a[l] >> sa) & ma) | (((b[l] >> sb) & mb) << lb) for l < 32 (no b: the first term) */
static inline void put32(uint8_t *u, const uint8_t *a, int sa, int ma, const uint8_t *b, int sb, int mb, int lb) {
    for (int l = 0; l < 32; l++) u[l] = (uint8_t)(((a[l] >> sa) & ma) | (b ? ((b[l] >> sb) & mb) << lb : 0));
}
#endif

#if defined(__AVX2__)
/* 16 bytes of nibbles -> 32 values (low nibbles first), with bit j of qh as value j's 5th bit */
static inline __m256i nib32(const uint8_t *qs, uint32_t qh, int five) {
    const __m128i m = _mm_set1_epi8(15);
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
    if (five) {  /* byte j of the broadcast word's byte j / 8, tested against bit j % 8 */
        const __m256i sel = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel);
        h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(16)));
    }
    return v;
}

/* a 32-column block's values from its bytes (f constant where inlined) */
static inline __m256i values32(int f, const uint8_t *p) {
    uint32_t qh = 0;
    switch (f) {
    case F_Q4_0: return nib32(p + 2, 0, 0);
    case F_Q4_1: return nib32(p + 4, 0, 0);
    case F_Q5_0: memcpy(&qh, p + 2, 4); return nib32(p + 6, qh, 1);     /* little-endian */
    case F_Q5_1: memcpy(&qh, p + 4, 4); return nib32(p + 8, qh, 1);
    default:     return _mm256_loadu_si256((const __m256i *)(p + 2));    /* Q8_0 */
    }
}
#endif

static inline void nibbles32(const uint8_t *qs, uint32_t qh, uint8_t *u) {
#if defined(__AVX2__)
    _mm256_storeu_si256((__m256i *)u, nib32(qs, qh, qh != 0));
#else
    for (int j = 0; j < 16; j++) { u[j] = qs[j] & 15; u[j + 16] = qs[j] >> 4; }
    for (int j = 0; j < 32; j++) u[j] |= ((qh >> j) & 1u) << 4;
#endif
}

#if defined(__AVX2__)
/* Every K-quant superblock goes straight into registers: its values, group scales and float
 * scales, from its bytes (no buffer: a one-row decode spent a quarter of its work storing the
 * values and loading them back) */
/* the low 16 bits of eight 32-bit lanes, as eight halves */
static inline __m128i low_words(__m256i w) {
    const __m256i p = _mm256_packus_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0xFFFF)), _mm256_setzero_si256());
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

/* the lane scales of the 8 registers of 32 columns c (groups 2c, 2c + 1: the low and the high
 * 128 bits) from the 16 group scales: the even groups' scales as int16 in the low 128 bits and the
 * odd groups' in the high, so that one in-lane byte shuffle a register picks group 2c's scale in
 * the low half and 2c + 1's in the high, in the form the instruction set multiplies by
 * (lane_scales_held) */
static inline void lane_scales32(__m128i g, __m256i *S) {
    const __m128i parity = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i halves = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(g, parity));
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        const char lo = (char)(2 * c), hi = (char)(2 * c + 1);
#if (defined(__AVX512VNNI__) && defined(__AVX512BW__)) || defined(__AVXVNNI__)
        const __m256i pick = _mm256_setr_epi8(lo, hi, -128, -128, lo, hi, -128, -128, lo, hi, -128, -128, lo, hi, -128, -128,
                                              lo, hi, -128, -128, lo, hi, -128, -128, lo, hi, -128, -128, lo, hi, -128, -128);
#else
        const __m256i pick = _mm256_setr_epi8(lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi,
                                              lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi);
#endif
        S[c] = _mm256_shuffle_epi8(halves, pick);
    }
}

/* the 32-column registers of a superblock (U[c]: columns 32c .. 32c + 31), in the layouts
 * formats/intform.py reads; the switch outside and the loops unrolled (constant shifts) */
#define BITS(a, sh, mask) _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(a)), sh), _mm256_set1_epi8(mask))
static inline void sb_values32(int f, const uint8_t *p, __m256i *U) {
    switch (f) {
    case F_Q2_K:        /* column 128h + 32s + l: (qs[32h + l] >> 2s) & 3 */
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) U[c] = BITS(p + 16 + 32 * (c / 4), 2 * (c % 4), 3);
        return;
    case F_Q3_K:        /* the same, with bit c of hmask[l] as bit 2 */
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) U[c] = _mm256_or_si256(BITS(p + 32 + 32 * (c / 4), 2 * (c % 4), 3), _mm256_slli_epi16(BITS(p, c, 1), 2));
        return;
    case F_Q4_K:        /* the low nibbles of qs[32 (c / 2) ..], then the high ones */
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) U[c] = BITS(p + 16 + 32 * (c / 2), 4 * (c % 2), 15);
        return;
    case F_Q5_K:        /* the same, with bit c of qh[l] as bit 4 */
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            U[c] = _mm256_or_si256(BITS(p + 48 + 32 * (c / 2), 4 * (c % 2), 15), _mm256_slli_epi16(BITS(p + 16, c, 1), 4));
        return;
    default:            /* Q6_K: column 128h + 32s + l from ql[64h + 32(s % 2) + l] >> 4(s / 2) and qh[32h + l] >> 2s */
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            U[c] = _mm256_or_si256(BITS(p + 64 * (c / 4) + 32 * (c % 2), 4 * ((c % 4) / 2), 15),
                                   _mm256_slli_epi16(BITS(p + 128 + 32 * (c / 4), 2 * (c % 4), 3), 4));
    }
}
#undef BITS

/* a held superblock's 16-column group scales (int8), and per group what multiplies its sum of q
 * (m16, as decode_row writes it), from the block's bytes */
static inline __m128i sb_groups_held(int f, const uint8_t *p, __m256i *m16) {
    if (f == F_Q2_K) {          /* byte g: scale in the low nibble, min in the high one */
        const __m128i s = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(15);
        *m16 = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m));
        return _mm_and_si128(s, m);
    }
    if (f == F_Q3_K) {          /* 16 6-bit scales - 32: low nibbles in bytes 96-103, top two bits in 104-107 */
        uint32_t w[3], v[4];
        memcpy(w, p + 96, 12);
        for (int k = 0; k < 4; k++)
            v[k] = ((k < 2 ? w[k] : w[k - 2] >> 4) & 0x0F0F0F0Fu) | (((w[2] >> (2 * k)) & 0x03030303u) << 4);
        const __m128i sc = _mm_sub_epi8(words4(v), _mm_set1_epi8(32));
        *m16 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 2);               /* zero point 4 */
        return sc;
    }
    if (f == F_Q4_K || f == F_Q5_K) {
        uint32_t v[4];
        k4_words(p + 4, v);
        const __m128i x = words4(v);
        *m16 = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(x, x));
        return _mm_unpacklo_epi8(x, x);
    }
    const __m128i sc = _mm_loadu_si128((const __m128i *)(p + 192));      /* Q6_K, zero point 32 */
    *m16 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(sc), _mm256_set1_epi16(32));
    return sc;
}

/* the 32-bit words at base + stride k for k < cnt, +0 after: scalar loads put together (a gather
 * made one-row GEMVs of 32-column blocks a third slower on Zen 4) */
static inline __m256i block_words(const uint8_t *base, int stride, int cnt) {
    uint32_t t[8];
    for (int k = 0; k < 8; k++) {
        t[k] = 0;
        if (k < cnt) memcpy(&t[k], base + (int64_t)stride * k, 4);
    }
    return _mm256_setr_epi32((int)t[0], (int)t[1], (int)t[2], (int)t[3], (int)t[4], (int)t[5], (int)t[6], (int)t[7]);
}

/* the float scales (d, and dmin where the format has one) of a held row's superblocks b .. b + 7,
 * dead lanes +0, from the 32-bit word that holds them (where d alone ends a block, the word ends
 * with it, so the read stays inside the block) */
static inline void sb_floats_held(int f, const uint8_t *raw, int bb, int cnt, __m256 *dw, __m256 *mw) {
    const int at = f == F_Q2_K ? 80 : f == F_Q3_K ? 106 : f == F_Q6_K ? 206 : 0, pair = f != F_Q3_K && f != F_Q6_K;
    const __m256i w = block_words(raw + at, bb, cnt);
    const __m256i hi = _mm256_srli_epi32(w, 16);
    *dw = _mm256_cvtph_ps(low_words(pair ? w : hi));
    *mw = pair ? _mm256_cvtph_ps(low_words(hi)) : _mm256_setzero_ps();
}

#endif

/* The scale of every int32 lane of a superblock's dot products (64 lanes of 4 columns: lane j
 * has group j / 4's), in the form the instruction set multiplies by: VNNI's vpdpwssd takes int16
 * pairs, so the scale sits in the low half over a zero (a dot lane fits in int16: 4 x 63 x 127 <
 * 2**15); AVX2's vpmaddwd multiplies vpmaddubsw's int16 pair sums, so the scale sits in both halves.
 * AVX-512 packs two registers of dot lanes into one of int16 (vpackssdw, which the same bound keeps
 * from saturating) and takes half as many vpdpwssd: 128-bit lane k of register c holds group 4c + k,
 * so packed register 2p + (0, 1), lane k, holds words of groups 8p + k, then 8p + 4 + k, four each. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
static inline void lane_scales_held(__m128i sc, __m512i *S) {
    const __m512i g = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc));
    for (int p = 0; p < 2; p++) {
        int16_t ix[32];
        for (int w = 0; w < 32; w++) ix[w] = (int16_t)(8 * p + w / 8 + (w % 8 < 4 ? 0 : 4));
        S[p] = _mm512_permutexvar_epi16(_mm512_loadu_si512(ix), g);
    }
}

/* 64 values from the 32 bytes a: ((a[l] >> s0) & mask) in the low half, ((a[l] >> s1) & mask) in
 * the high (16-bit shifts: the mask drops what the byte above shifted in) */
static inline __m512i halves(const uint8_t *a, int s0, int s1, int mask) {
    const __m512i cnt = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)s0)),
                                           _mm256_set1_epi16((short)s1), 1);
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)a));
    return _mm512_and_si512(_mm512_srlv_epi16(v, cnt), _mm512_set1_epi8((char)mask));
}

/* register c: columns 64c .. 64c + 63, in the layouts formats/intform.py reads (the switch outside
 * and the loops unrolled: the shift counts must be constants) */
static inline void sb_held(int f, const uint8_t *p, __m512i *U) {
    switch (f) {
    case F_Q2_K:        /* column 128h + 32s + l: (qs[32h + l] >> 2s) & 3 */
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) U[c] = halves(p + 16 + 32 * (c / 2), 4 * (c % 2), 4 * (c % 2) + 2, 3);
        return;
    case F_Q3_K:        /* the same, with bit 4h + s of hmask[l] as bit 2 */
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            U[c] = _mm512_or_si512(halves(p + 32 + 32 * (c / 2), 4 * (c % 2), 4 * (c % 2) + 2, 3),
                                   _mm512_slli_epi16(halves(p, 2 * c, 2 * c + 1, 1), 2));
        return;
    case F_Q4_K:        /* the low nibbles of qs[32c ..], then the high ones */
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) U[c] = halves(p + 16 + 32 * c, 0, 4, 15);
        return;
    case F_Q5_K:        /* the same, with bits 2c and 2c + 1 of qh[l] as bit 4 */
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            U[c] = _mm512_or_si512(halves(p + 48 + 32 * c, 0, 4, 15), _mm512_slli_epi16(halves(p + 16, 2 * c, 2 * c + 1, 1), 4));
        return;
    default: {          /* Q6_K: column 128h + 32s + l from ql[64h + 32(s % 2) + l] >> 4(s / 2) and qh[32h + l] >> 2s;
                         * x: qh[32h ..] >> 0 in the low half, >> 2 in the high, so bits 0-1 serve
                         * register 2h and bits 4-5 register 2h + 1 (ternary logic 0xEC: (a & c) | b) */
        const __m512i m15 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3), m48 = _mm512_set1_epi8(48);
        const __m512i cnt = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(p + 64 * h);
            const __m512i x = _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h))), cnt);
            U[2 * h] = _mm512_ternarylogic_epi32(ql, _mm512_slli_epi16(_mm512_and_si512(x, m3), 4), m15, 0xEC);
            U[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), _mm512_and_si512(x, m48), m15, 0xEC);
        }
    }
    }
}
#endif

static void decode_row(int f, const uint8_t *src, const float *scales, int64_t cols, Row *o) {
    const int bb = BLOCK_BYTES[f];
    if (f == F_INT8) {
        memcpy(o->u, src, (size_t)cols);
        for (int64_t b = 0; b < cols / 32; b++) o->dw[b] = scales[0];
        return;
    }
    if (f == F_INT4G64) {
        for (int64_t i = 0; i < cols / 2; i++) {
            o->u[2 * i] = src[i] & 15;
            o->u[2 * i + 1] = src[i] >> 4;
        }
        for (int64_t b = 0; b < cols / 32; b++) o->dw[b] = scales[b / 2];
        return;
    }
    if (f <= F_Q8_0) {
        for (int64_t b = 0; b < cols / 32; b++) {
            const uint8_t *p = src + b * bb;
            uint8_t *u = o->u + 32 * b;
            o->dw[b] = f16(p);
            if (f == F_Q8_0) { memcpy(u, p + 2, 32); continue; }
            if (f == F_Q4_1 || f == F_Q5_1) o->mw[b] = f16(p + 2);
            const uint8_t *qs = p + (f == F_Q4_0 ? 2 : f == F_Q4_1 ? 4 : f == F_Q5_0 ? 6 : 8);
            uint32_t qh = 0;
            if (f == F_Q5_0 || f == F_Q5_1) memcpy(&qh, p + (f == F_Q5_0 ? 2 : 4), 4);   /* little-endian */
            nibbles32(qs, qh, u);
        }
        return;
    }
#if !defined(__AVX2__)
    for (int64_t b = 0; b < cols / 256; b++) {
        const uint8_t *p = src + b * bb;
        uint8_t *u = o->u + 256 * b;
        int8_t *sc = o->sc + 16 * b, *mn = o->mn + 16 * b;
        if (f == F_Q2_K) {
            o->dw[b] = f16(p + 80); o->mw[b] = f16(p + 82);
            for (int g = 0; g < 16; g++) { sc[g] = (int8_t)(p[g] & 15); mn[g] = (int8_t)(p[g] >> 4); }
            for (int half = 0; half < 2; half++)
                for (int ps = 0; ps < 4; ps++) put32(u + 128 * half + 32 * ps, p + 16 + 32 * half, 2 * ps, 3, 0, 0, 0, 0);
        } else if (f == F_Q3_K) {
            o->dw[b] = f16(p + 108);
            const uint8_t *lo = p + 96, *hi = p + 104;
            int8_t t[16];
            for (int g = 0; g < 8; g++) { t[g] = (int8_t)(lo[g] & 15); t[g + 8] = (int8_t)(lo[g] >> 4); }
            for (int g = 0; g < 16; g++) t[g] = (int8_t)((t[g] | (((hi[g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32);
            memcpy(sc, t, 16);
            for (int half = 0; half < 2; half++)
                for (int ps = 0; ps < 4; ps++)
                    put32(u + 128 * half + 32 * ps, p + 32 + 32 * half, 2 * ps, 3, p, 4 * half + ps, 1, 2);
        } else if (f == F_Q4_K || f == F_Q5_K) {
            o->dw[b] = f16(p); o->mw[b] = f16(p + 2);
            k4_scales(p + 4, sc, mn);
            const uint8_t *qs = p + (f == F_Q4_K ? 16 : 48), *qh = f == F_Q5_K ? p + 16 : 0;
            for (int c = 0; c < 4; c++) {
                put32(u + 64 * c, qs + 32 * c, 0, 15, qh, 2 * c, 1, 4);
                put32(u + 64 * c + 32, qs + 32 * c, 4, 15, qh, 2 * c + 1, 1, 4);
            }
        } else {                                                    /* Q6_K */
            o->dw[b] = f16(p + 208);
            memcpy(sc, p + 192, 16);
            for (int half = 0; half < 2; half++)
                for (int k = 0; k < 4; k++)
                    put32(u + 128 * half + 32 * k, p + 64 * half + 32 * (k % 2), 4 * (k / 2), 15,
                          p + 128 + 32 * half, 2 * k, 3, 4);
        }
    }
#endif
}

#endif
