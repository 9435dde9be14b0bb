/* Integer block dots for q8 activations: the compiled twin of vkspec.exact's
 * quantize_q8 / q8_dot (and formats/intform.py for what the bytes mean).
 *
 * One source, compiled once per instruction set (build.py): AVX-512 VNNI,
 * AVX-VNNI, AVX2 and plain C. Only dot32 differs between them; integer sums
 * are exact in any order, so the choice changes no bit. The float part is
 * written once, in exact.py's order: per float block (dw * dx) * float(s1),
 * then +/- (mw * dx) * float(s2); block b into lane b mod 8 from +0; lanes
 * folded l += l + 4, 2, 1. Built with -ffp-contract=off: nothing fuses.
 *
 * A weight row is decoded once into unsigned (or, for Q8_0/int8, signed)
 * bytes with the format's zero point, integer sub-block scales and float
 * block scales, then dotted with every activation row of the call: prefill
 * and verify rows share the decode, and each row's bits stay its own.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

enum { F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_Q8_0, F_INT8, F_INT4G64, F_Q2_K, F_Q3_K, F_Q4_K, F_Q5_K, F_Q6_K };

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

/* exact._recip for a positive normal finite a (all quantize_q8 passes it) */
static float recip(float a) {
    uint32_t b = to_bits(a);
    int32_t e = (int32_t)((b >> 23) & 0xFFu);
    float m = from_bits((b & 0x007FFFFFu) | 0x3F000000u);
    float y = (float)(48.0 / 17.0) - (float)(32.0 / 17.0) * m;
    for (int i = 0; i < 3; i++) y = y + y * (1.0f - m * y);
    int32_t s = 126 - e, s1 = s >> 1, s2 = s - s1;
    return (y * from_bits((uint32_t)(s1 + 127) << 23)) * from_bits((uint32_t)(s2 + 127) << 23);
}

/* ---- activations: exact.quantize_q8 and q8_sums ------------------------------------ */

void vk_q8_quantize(const float *x, int64_t n, int64_t cols, int64_t fb,
                    int8_t *q, float *d, int16_t *s16, int32_t *s32) {
    const float inv_max = (float)(1.0 / 127.0), magic = 12582912.0f, min_normal = 1.17549435e-38f;
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * cols;
        int8_t *qr = q + r * cols;
        for (int64_t b = 0; b < cols / fb; b++) {
            const float *xb = xr + b * fb;
            uint32_t bad = 0;
            float amax = 0.0f;
            for (int64_t i = 0; i < fb; i++) {
                uint32_t u = to_bits(xb[i]);
                bad |= (u & 0x7F800000u) == 0x7F800000u;
                float a = from_bits(u & 0x7FFFFFFFu);
                amax = a > amax ? a : amax;
            }
            float db = amax * inv_max;
            int ok = !bad && db >= min_normal;
            float inv = recip(ok ? db : 1.0f);
            for (int64_t i = 0; i < fb; i++) {
                float v = (xb[i] * inv + magic) - magic;
                v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
                qr[b * fb + i] = ok ? (int8_t)(int32_t)v : 0;
            }
            d[r * (cols / fb) + b] = bad ? from_bits(0x7FC00000u) : (ok ? db : 0.0f);
        }
        for (int64_t g = 0; g < cols / 16; g++) {
            int32_t s = 0;
            for (int i = 0; i < 16; i++) s += qr[16 * g + i];
            s16[r * (cols / 16) + g] = (int16_t)s;       /* |s| <= 16 x 127 */
        }
        for (int64_t g = 0; g < cols / 32; g++)
            s32[r * (cols / 32) + g] = s16[r * (cols / 16) + 2 * g] + s16[r * (cols / 16) + 2 * g + 1];
    }
}

/* ---- one weight row decoded --------------------------------------------------------- */

typedef struct {
    uint8_t *u;         /* cols bytes: unsigned value + zero point, or signed (Q8_0, int8) */
    float *dw, *mw;     /* per float block: d (or dmin's partner) and m / dmin */
    int8_t *sc, *mn;    /* K-quants: scale and min per 16 columns (signed scales fit: Q6_K's are int8) */
    int32_t *scv;       /* K-quants: the scale of each int32 lane of the dot products (lane_scales) */
    int16_t *m16;       /* K-quants: per 16 columns, what multiplies its sum of q: the min (Q2_K, Q4_K,
                           Q5_K) or z x scale (Q3_K, Q6_K; |4096| at most) */
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

/* Q4_K/Q5_K's eight 6-bit (scale, min) pairs in 12 bytes (formats/ggml.py _k4_scales_mins),
 * four at a time as the bytes of a little-endian word, each widened to the two 16-column
 * groups it covers */
static void k4_scales(const uint8_t *s, int8_t *sc, int8_t *mn) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4); memcpy(&w1, s + 4, 4); memcpy(&w2, s + 8, 4);
    uint32_t lo = w0 & 0x3F3F3F3Fu, hi = (w2 & 0x0F0F0F0Fu) | (((w0 >> 6) & 0x03030303u) << 4);
    uint32_t mlo = w1 & 0x3F3F3F3Fu, mhi = ((w2 >> 4) & 0x0F0F0F0Fu) | (((w1 >> 6) & 0x03030303u) << 4);
#if defined(__AVX2__)
    /* each 16 bytes stored at once: the lane scales load them back as one (16 byte stores
     * followed by a 16-byte load stall until they retire: measured 44% of a Q4_K GEMV) */
    __m128i v = _mm_setr_epi32((int)lo, (int)hi, (int)mlo, (int)mhi);
    _mm_storeu_si128((__m128i *)sc, _mm_unpacklo_epi8(v, v));
    _mm_storeu_si128((__m128i *)mn, _mm_unpackhi_epi8(v, v));
#else
    uint32_t v[4] = {lo, hi, mlo, mhi};
    uint8_t b[16];
    memcpy(b, v, 16);                 /* scales 0-7, then mins 0-7 */
    for (int g = 0; g < 16; g++) { sc[g] = (int8_t)b[g / 2]; mn[g] = (int8_t)b[8 + g / 2]; }
#endif
}

/* 16 bytes of nibbles -> 32 values (low nibbles first), with bit j of qh as value j's 5th bit */
static inline void nibbles32(const uint8_t *qs, uint32_t qh, uint8_t *u) {
#if defined(__AVX2__)
    const __m128i m = _mm_set1_epi8(15);
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
    if (qh) {   /* byte j of the broadcast word's byte j / 8, tested against bit j % 8 */
        const __m256i sel = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel);
        h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(16)));
    }
    _mm256_storeu_si256((__m256i *)u, v);
#else
    for (int j = 0; j < 16; j++) { u[j] = qs[j] & 15; u[j + 16] = qs[j] >> 4; }
    for (int j = 0; j < 32; j++) u[j] |= ((qh >> j) & 1u) << 4;
#endif
}

/* u[l] = ((a[l] >> sa) & ma) | (((b[l] >> sb) & mb) << lb) for l < 32 (no b: the first term) */
static inline void put32(uint8_t *u, const uint8_t *a, int sa, int ma, const uint8_t *b, int sb, int mb, int lb) {
#if defined(__AVX2__)
    __m256i v = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)a), _mm_cvtsi32_si128(sa)),
                                 _mm256_set1_epi8((char)ma));
    if (b) {
        __m256i h = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)b), _mm_cvtsi32_si128(sb)),
                                     _mm256_set1_epi8((char)mb));
        v = _mm256_or_si256(v, _mm256_sll_epi16(h, _mm_cvtsi32_si128(lb)));
    }
    _mm256_storeu_si256((__m256i *)u, v);
#else
    for (int l = 0; l < 32; l++) u[l] = (uint8_t)(((a[l] >> sa) & ma) | (b ? ((b[l] >> sb) & mb) << lb : 0));
#endif
}

/* The scale of every int32 lane of a superblock's dot products (64 lanes of 4 columns: lane j
 * has group j / 4's), in the form the instruction set multiplies by: VNNI's vpdpwssd takes int16
 * pairs, so the scale sits in the low half over a zero (a dot lane fits in int16: 4 x 63 x 127 <
 * 2**15); AVX2's vpmaddwd multiplies vpmaddubsw's int16 pair sums, so the scale sits in both halves. */
static void lane_scales(const int8_t *sc, int32_t *scv) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    const __m512i g = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc)),
                                       _mm512_set1_epi32(0xFFFF));
    for (int k = 0; k < 4; k++)         /* 64 columns: groups 4k .. 4k + 3, four lanes each */
        _mm512_storeu_si512(scv + 16 * k, _mm512_permutexvar_epi32(
            _mm512_setr_epi32(4 * k, 4 * k, 4 * k, 4 * k, 4 * k + 1, 4 * k + 1, 4 * k + 1, 4 * k + 1,
                              4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 3), g));
#elif defined(__AVX2__)
    __m128i g = _mm_loadu_si128((const __m128i *)sc);
    for (int c = 0; c < 8; c++) {       /* 32 columns: groups 2c (lanes 0-3) and 2c + 1 (lanes 4-7) */
        __m128i pick = _mm_setr_epi8(2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1,
                                     2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1);
        __m256i v = _mm256_cvtepi8_epi32(_mm_shuffle_epi8(g, pick));
#if (defined(__AVX512VNNI__) && defined(__AVX512BW__)) || defined(__AVXVNNI__)
        v = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
#else
        v = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
#endif
        _mm256_storeu_si256((__m256i *)(scv + 8 * c), v);
    }
#else
    (void)sc; (void)scv;
#endif
}

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
    for (int64_t b = 0; b < cols / 256; b++) {
        const uint8_t *p = src + b * bb;
        uint8_t *u = o->u + 256 * b;
        int8_t *sc = o->sc + 16 * b, *mn = o->mn + 16 * b;
        if (f == F_Q2_K) {
            o->dw[b] = f16(p + 80); o->mw[b] = f16(p + 82);
#if defined(__AVX2__)
            __m128i s = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(15);
            _mm_storeu_si128((__m128i *)sc, _mm_and_si128(s, m));
            _mm_storeu_si128((__m128i *)mn, _mm_and_si128(_mm_srli_epi16(s, 4), m));
#else
            for (int g = 0; g < 16; g++) { sc[g] = (int8_t)(p[g] & 15); mn[g] = (int8_t)(p[g] >> 4); }
#endif
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
        lane_scales(sc, o->scv + 64 * b);
        const int zk = zero_point(f);
#if defined(__AVX2__)
        __m256i m = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(zk ? sc : mn)));
        _mm256_storeu_si256((__m256i *)(o->m16 + 16 * b), zk ? _mm256_mullo_epi16(m, _mm256_set1_epi16((short)zk)) : m);
#else
        for (int g = 0; g < 16; g++) o->m16[16 * b + g] = (int16_t)(zk ? zk * sc[g] : mn[g]);
#endif
    }
}

/* ---- the integer dot of 32 bytes: the one place the instruction sets differ ---------- */

#if defined(__AVX2__)
typedef __m256i I8;              /* 8 int32 lanes: lane i sums bytes 4i..4i+3 */

static inline I8 dot32_u(const uint8_t *u, const int8_t *q) {   /* u <= 63 (no saturation on AVX2) */
    __m256i a = _mm256_loadu_si256((const __m256i *)u), b = _mm256_loadu_si256((const __m256i *)q);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

static inline I8 dot32_s(const uint8_t *w, const int8_t *q) {   /* signed weights: |w| * sign(w) q */
    __m256i a = _mm256_loadu_si256((const __m256i *)w), b = _mm256_loadu_si256((const __m256i *)q);
    __m256i ua = _mm256_abs_epi8(a), sb = _mm256_sign_epi8(b, a);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), ua, sb);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ua, sb);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ua, sb), _mm256_set1_epi16(1));
#endif
}

static inline int32_t hsum(I8 v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    return _mm_cvtsi128_si32(s);
}

static inline I8 hsum8(const I8 *p) {          /* [hsum(p[0]) .. hsum(p[7])] */
    __m256i ab = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i cd = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}
#endif

static inline int32_t dot32(const uint8_t *u, const int8_t *q, int sgn) {
#if defined(__AVX2__)
    return hsum(sgn ? dot32_s(u, q) : dot32_u(u, q));
#else
    int32_t s = 0;
    if (sgn) for (int i = 0; i < 32; i++) s += (int8_t)u[i] * q[i];
    else for (int i = 0; i < 32; i++) s += u[i] * q[i];
    return s;
#endif
}

static inline float fold8(const float *l) {
    float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
    float b0 = a0 + a2, b1 = a1 + a3;
    return b0 + b1;
}

/* one activation row against a decoded 32-column-block row */
static float row_b32(const Row *w, int64_t nb, int z, int sgn, int mins,
                     const int8_t *q, const float *dx, const int32_t *s32) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t b = 0;
#if defined(__AVX2__)
    __m256 lanes = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        I8 p[8];
        for (int k = 0; k < 8; k++)
            p[k] = sgn ? dot32_s(w->u + 32 * (b + k), q + 32 * (b + k)) : dot32_u(w->u + 32 * (b + k), q + 32 * (b + k));
        __m256i bs = _mm256_loadu_si256((const __m256i *)(s32 + b));
        __m256i s1 = _mm256_sub_epi32(hsum8(p), _mm256_mullo_epi32(bs, _mm256_set1_epi32(z)));
        __m256 x = _mm256_loadu_ps(dx + b);
        __m256 a = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(w->dw + b), x), _mm256_cvtepi32_ps(s1));
        if (mins) a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(w->mw + b), x), _mm256_cvtepi32_ps(bs)));
        lanes = _mm256_add_ps(lanes, a);
    }
    _mm256_storeu_ps(l, lanes);
#endif
    for (; b < nb; b++) {
        int32_t s1 = dot32(w->u + 32 * b, q + 32 * b, sgn) - z * s32[b];
        float a = (w->dw[b] * dx[b]) * (float)s1;
        if (mins) a = a + (w->mw[b] * dx[b]) * (float)s32[b];
        l[b & 7] = l[b & 7] + a;
    }
    return fold8(l);
}


#if defined(__AVX2__)
#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__))     /* AVX-512 holds them in registers: sb_dot_held */
/* int32 lanes whose sum is sum_g sc_g * (u . q over group g) for one 256-column superblock */
static inline I8 sb_dot(const uint8_t *u, const int8_t *q, const int32_t *scv) {
#if defined(__AVXVNNI__)
    __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int c = 0; c < 8; c++)
        acc[c & 1] = _mm256_dpwssd_avx_epi32(acc[c & 1], dot32_u(u + 32 * c, q + 32 * c),
                                             _mm256_loadu_si256((const __m256i *)(scv + 8 * c)));
    return _mm256_add_epi32(acc[0], acc[1]);
#else
    __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int c = 0; c < 8; c++) {
        __m256i pairs = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(u + 32 * c)),
                                             _mm256_loadu_si256((const __m256i *)(q + 32 * c)));
        acc[c & 1] = _mm256_add_epi32(acc[c & 1], _mm256_madd_epi16(pairs, _mm256_loadu_si256((const __m256i *)(scv + 8 * c))));
    }
    return _mm256_add_epi32(acc[0], acc[1]);
#endif
}

#endif

/* int32 lanes whose sum is sum_g a_g * b_g over 16 groups, both int16 */
static inline I8 dot16(const int16_t *a, const int16_t *b) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a), _mm256_loadu_si256((const __m256i *)b));
}
#endif

/* one K-quant superblock's integer sums against one activation row: s1 = sum_g sc_g (u.q - z sum q)
 * over its 16-column groups g, s2 = sum_g mn_g sum q */
static inline void sb_sums(const Row *w, int64_t b, int z, int mins, const int8_t *q, const int16_t *s16,
                           int32_t *s1, int32_t *s2) {
    const uint8_t *u = w->u + 256 * b;
    const int8_t *qb = q + 256 * b;
    const int16_t *sg = s16 + 16 * b;
    const int8_t *sc = w->sc + 16 * b, *mn = w->mn + 16 * b;
    int32_t d = 0, zs = 0, m = 0;
    for (int g = 0; g < 16; g++) {
        int32_t s = 0;
        for (int i = 0; i < 16; i++) s += u[16 * g + i] * qb[16 * g + i];
        d += sc[g] * s;
        zs += sc[g] * sg[g];
        m += mn[g] * sg[g];
    }
    *s1 = d - z * zs;
    *s2 = mins ? m : 0;
}

#if !defined(__AVX2__)
/* one activation row against a decoded K-quant row, superblock by superblock (plain C) */
static float row_k(const Row *w, int64_t nb, int z, int mins, const int8_t *q, const float *dx, const int16_t *s16) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t b = 0; b < nb; b++) {
        int32_t s1, s2;
        sb_sums(w, b, z, mins, q, s16, &s1, &s2);
        float a = (w->dw[b] * dx[b]) * (float)s1;
        if (mins) a = a - (w->mw[b] * dx[b]) * (float)s2;
        l[b & 7] = l[b & 7] + a;
    }
    return fold8(l);
}
#endif

#if defined(__AVX2__)
/* one superblock against one activation row, its weights and lane scales already in registers */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
static inline I8 sb_dot_held(const __m512i *U, const __m512i *S, const int8_t *q) {
    __m512i a0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), U[0], _mm512_loadu_si512(q)), S[0]);
    __m512i a1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), U[1], _mm512_loadu_si512(q + 64)), S[1]);
    a0 = _mm512_dpwssd_epi32(a0, _mm512_dpbusd_epi32(_mm512_setzero_si512(), U[2], _mm512_loadu_si512(q + 128)), S[2]);
    a1 = _mm512_dpwssd_epi32(a1, _mm512_dpbusd_epi32(_mm512_setzero_si512(), U[3], _mm512_loadu_si512(q + 192)), S[3]);
    a0 = _mm512_add_epi32(a0, a1);
    return _mm256_add_epi32(_mm512_castsi512_si256(a0), _mm512_extracti64x4_epi64(a0, 1));
}
#endif

/* every activation row against a decoded K-quant row: superblocks outer, rows inner, so that a
 * superblock's weights and lane scales are loaded once for all the rows (L1's load ports, not
 * the arithmetic, bound the rows-outer order). P: 8 n vectors, L: 8 n floats of scratch. */
static void rows_k(const Row *w, int64_t nb, int z, int mins, const int8_t *q, const float *dx, const int16_t *s16,
                   int64_t n, int64_t cols, float *y, int64_t ys, I8 *P, float *L) {
    for (int64_t r = 0; r < 8 * n; r++) L[r] = 0.0f;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        for (int j = 0; j < 8; j++) {
            const uint8_t *u = w->u + 256 * (b + j);
            const int32_t *scv = w->scv + 64 * (b + j);
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
            __m512i U[4], S[4];
            for (int c = 0; c < 4; c++) { U[c] = _mm512_loadu_si512(u + 64 * c); S[c] = _mm512_loadu_si512(scv + 16 * c); }
            for (int64_t r = 0; r < n; r++) P[8 * r + j] = sb_dot_held(U, S, q + r * cols + 256 * (b + j));
#else
            for (int64_t r = 0; r < n; r++) P[8 * r + j] = sb_dot(u, q + r * cols + 256 * (b + j), scv);
#endif
        }
        for (int64_t r = 0; r < n; r++) {
            const int16_t *sr = s16 + r * (cols / 16) + 16 * b;
            I8 t[8];
            for (int j = 0; j < 8; j++) t[j] = dot16(w->m16 + 16 * (b + j), sr + 16 * j);
            __m256i s1 = hsum8(P + 8 * r), s2 = _mm256_setzero_si256();
            if (z) s1 = _mm256_sub_epi32(s1, hsum8(t));
            if (mins) s2 = hsum8(t);
            __m256 x = _mm256_loadu_ps(dx + r * nb + b);
            __m256 a = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(w->dw + b), x), _mm256_cvtepi32_ps(s1));
            if (mins)
                a = _mm256_sub_ps(a, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(w->mw + b), x), _mm256_cvtepi32_ps(s2)));
            _mm256_storeu_ps(L + 8 * r, _mm256_add_ps(_mm256_loadu_ps(L + 8 * r), a));
        }
    }
    for (; b < nb; b++)
        for (int64_t r = 0; r < n; r++) {
            int32_t s1, s2;
            sb_sums(w, b, z, mins, q + r * cols, s16 + r * (cols / 16), &s1, &s2);
            float a = (w->dw[b] * dx[r * nb + b]) * (float)s1;
            if (mins) a = a - (w->mw[b] * dx[r * nb + b]) * (float)s2;
            L[8 * r + (b & 7)] = L[8 * r + (b & 7)] + a;
        }
    for (int64_t r = 0; r < n; r++) y[r * ys] = fold8(L + 8 * r);
}
#endif


/* One matrix of a vk_q8_gemvs call; mirrored by qdot.py's Mat. */
typedef struct {
    int32_t fmt, pad;
    const uint8_t *w;          /* rows of row_bytes, stored order */
    int64_t row_bytes;
    const float *scales;       /* int8 / int4-g64: (stored rows, scale_stride) */
    int64_t scale_stride;
    const int64_t *order;      /* logical row i is stored row order[i] (NULL: the same) */
    int64_t rows, cols;
    float *y;                  /* y[r * y_stride + i]: activation row r, logical row i */
    int64_t y_stride;
} Mat;

typedef struct { int8_t *q; float *d; int16_t *s16; int32_t *s32; } Acts;

static void one_row(const Mat *m, int64_t i, const Acts *a, int64_t n, Row *o, void *P, float *L) {
    const int f = m->fmt, kq = f >= F_Q2_K, fb = kq ? 256 : 32, z = zero_point(f);
    const int sgn = f == F_Q8_0 || f == F_INT8;
    const int mins = f == F_Q4_1 || f == F_Q5_1 || f == F_Q2_K || f == F_Q4_K || f == F_Q5_K;
    const int64_t cols = m->cols, nb = cols / fb, src = m->order ? m->order[i] : i;
    decode_row(f, m->w + src * m->row_bytes, m->scales ? m->scales + src * m->scale_stride : 0, cols, o);
#if defined(__AVX2__)
    if (kq) {
        rows_k(o, nb, z, mins, a->q, a->d, a->s16, n, cols, m->y + i, m->y_stride, (I8 *)P, L);
        return;
    }
    for (int64_t r = 0; r < n; r++)    /* rows inner measured slower here: the row's 32-byte blocks
                                          are cheap to load again, the scratch is not */
        m->y[r * m->y_stride + i] = row_b32(o, nb, z, sgn, mins, a->q + r * cols, a->d + r * nb, a->s32 + r * (cols / 32));
#else
    (void)P; (void)L;
    for (int64_t r = 0; r < n; r++)
        m->y[r * m->y_stride + i] = kq ? row_k(o, nb, z, mins, a->q + r * cols, a->d + r * nb, a->s16 + r * (cols / 16))
                                       : row_b32(o, nb, z, sgn, mins, a->q + r * cols, a->d + r * nb, a->s32 + r * (cols / 32));
#endif
}

/* The matrices one input x (n rows of cols float32) feeds, in one call: x quantised once per
 * block size they need (vk_q8_quantize), then every matrix's rows shared out among the threads
 * with no barrier between matrices. Returns 0, or -1 when memory runs out (nothing written). */
int vk_q8_gemvs(const Mat *mats, int count, const float *x, int64_t n, int threads) {
    if (count <= 0 || n <= 0) return 0;
    const int64_t cols = mats[0].cols;
    int need[2] = {0, 0};
    int64_t total = 0;
    for (int k = 0; k < count; k++) { need[mats[k].fmt >= F_Q2_K] = 1; total += mats[k].rows; }
    Acts acts[2] = {{0}, {0}};
    int failed = 0;
    for (int kq = 0; kq < 2; kq++) {
        if (!need[kq]) continue;
        const int64_t fb = kq ? 256 : 32;
        acts[kq].q = malloc((size_t)(n * cols));
        acts[kq].d = malloc(sizeof(float) * (size_t)(n * (cols / fb)));
        acts[kq].s16 = malloc(sizeof(int16_t) * (size_t)(n * (cols / 16) + 16));
        acts[kq].s32 = malloc(sizeof(int32_t) * (size_t)(n * (cols / 32) + 8));
        if (!acts[kq].q || !acts[kq].d || !acts[kq].s16 || !acts[kq].s32) { failed = 1; continue; }
        vk_q8_quantize(x, n, cols, fb, acts[kq].q, acts[kq].d, acts[kq].s16, acts[kq].s32);
    }
    if (threads <= 0) threads = 1;
    if (total < 64) threads = 1;
    /* every thread's scratch in one block, carved by thread number: no allocation, no barrier
     * inside the parallel region */
    const size_t a64 = 64, su = (size_t)(cols + 63) / 64 * 64, sf = (sizeof(float) * (size_t)(cols / 32 + 1) + 63) / 64 * 64,
                 s8 = ((size_t)(cols / 16 + 16) + 63) / 64 * 64, sv = (sizeof(int32_t) * (size_t)(cols / 4 + 16) + 63) / 64 * 64,
                 s6 = (sizeof(int16_t) * (size_t)(cols / 16 + 16) + 63) / 64 * 64, sp = 32 * (size_t)(8 * n + 8),
                 sl = (sizeof(float) * (size_t)(8 * n + 8) + 63) / 64 * 64;
    /* whole pages a thread, a page apart: neighbouring threads' scratch on shared or adjacent lines
     * cost a third of the 2-thread rate (the adjacent-line prefetcher pairs lines across them) */
    const size_t per = (su + 2 * sf + 2 * s8 + sv + s6 + sp + sl + 4095) / 4096 * 4096 + 4096;
    char *scratch = failed ? 0 : aligned_alloc(a64, per * (size_t)threads);
    if (!scratch) failed = 1;
    #pragma omp parallel num_threads(threads) if (!failed && threads > 1)
    {
#if defined(_OPENMP)
        char *p = scratch + per * (size_t)omp_get_thread_num();
#else
        char *p = scratch;
#endif
        Row o;
        o.u = (uint8_t *)p; p += su;
        o.dw = (float *)p; p += sf;
        o.mw = (float *)p; p += sf;
        o.sc = (int8_t *)p; p += s8;
        o.mn = (int8_t *)p; p += s8;
        o.scv = (int32_t *)p; p += sv;
        o.m16 = (int16_t *)p; p += s6;
        void *P = p; p += sp;
        float *L = (float *)p;
        for (int k = 0; k < count && !failed; k++) {
            const Mat *m = &mats[k];
            /* long runs of rows a thread: the hardware prefetchers follow one stream a thread
             * (8-row chunks handed out in turn read at half the bandwidth) */
            int64_t chunk = m->rows / (4 * threads);
            chunk = chunk < 8 ? 8 : chunk > 256 ? 256 : chunk;
            #pragma omp for schedule(dynamic, chunk) nowait
            for (int64_t i = 0; i < m->rows; i++) one_row(m, i, &acts[m->fmt >= F_Q2_K], n, &o, P, L);
        }
    }
    free(scratch);
    for (int kq = 0; kq < 2; kq++) { free(acts[kq].q); free(acts[kq].d); free(acts[kq].s16); free(acts[kq].s32); }
    return failed ? -1 : 0;
}
