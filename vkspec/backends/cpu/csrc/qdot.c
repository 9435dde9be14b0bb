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

enum { F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_Q8_0, F_INT8, F_INT4G64, F_Q2_K, F_Q3_K, F_Q4_K, F_Q5_K, F_Q6_K };

static const int BLOCK_BYTES[] = {18, 20, 22, 24, 34, 32, 16, 84, 110, 144, 176, 210};

static inline float from_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t to_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

/* formats/ggml.py f16_bits_to_f32: exact widening, subnormals by one product */
static float f16(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
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
                    int8_t *q, float *d, int32_t *s16, int32_t *s32) {
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
            s16[r * (cols / 16) + g] = s;
        }
        for (int64_t g = 0; g < cols / 32; g++)
            s32[r * (cols / 32) + g] = s16[r * (cols / 16) + 2 * g] + s16[r * (cols / 16) + 2 * g + 1];
    }
}

/* ---- one weight row decoded --------------------------------------------------------- */

typedef struct {
    uint8_t *u;         /* cols bytes: unsigned value + zero point, or signed (Q8_0, int8) */
    float *dw, *mw;     /* per float block: d (or dmin's partner) and m / dmin */
    int32_t *sc, *mn;   /* K-quants: per 16 columns */
    int32_t *scv;       /* K-quants: per 32 columns, 8 int32 lanes: sc of the first 16 x4, second x4 */
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

static void k4_scales(const uint8_t *s, int32_t *sc, int32_t *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63; mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
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
            for (int j = 0; j < 16; j++) { u[j] = qs[j] & 15; u[j + 16] = qs[j] >> 4; }
            if (f == F_Q5_0 || f == F_Q5_1) {
                const uint8_t *h = p + (f == F_Q5_0 ? 2 : 4);
                uint32_t qh = (uint32_t)h[0] | ((uint32_t)h[1] << 8) | ((uint32_t)h[2] << 16) | ((uint32_t)h[3] << 24);
                for (int j = 0; j < 32; j++) u[j] |= ((qh >> j) & 1u) << 4;
            }
        }
        return;
    }
    for (int64_t b = 0; b < cols / 256; b++) {
        const uint8_t *p = src + b * bb;
        uint8_t *u = o->u + 256 * b;
        int32_t *sc = o->sc + 16 * b, *mn = o->mn + 16 * b;
        if (f == F_Q2_K) {
            o->dw[b] = f16(p + 80); o->mw[b] = f16(p + 82);
            for (int g = 0; g < 16; g++) { sc[g] = p[g] & 15; mn[g] = p[g] >> 4; }
            for (int half = 0; half < 2; half++)
                for (int ps = 0; ps < 4; ps++)
                    for (int l = 0; l < 32; l++) u[128 * half + 32 * ps + l] = (p[16 + 32 * half + l] >> (2 * ps)) & 3;
        } else if (f == F_Q3_K) {
            o->dw[b] = f16(p + 108);
            const uint8_t *lo = p + 96, *hi = p + 104;
            for (int g = 0; g < 8; g++) { sc[g] = lo[g] & 15; sc[g + 8] = lo[g] >> 4; }
            for (int g = 0; g < 16; g++) sc[g] = (sc[g] | (((hi[g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32;
            for (int half = 0; half < 2; half++)
                for (int ps = 0; ps < 4; ps++)
                    for (int l = 0; l < 32; l++)
                        u[128 * half + 32 * ps + l] = ((p[32 + 32 * half + l] >> (2 * ps)) & 3)
                                                    | (((p[l] >> (4 * half + ps)) & 1) << 2);
        } else if (f == F_Q4_K || f == F_Q5_K) {
            int32_t s8[8], m8[8];
            o->dw[b] = f16(p); o->mw[b] = f16(p + 2);
            k4_scales(p + 4, s8, m8);
            for (int g = 0; g < 16; g++) { sc[g] = s8[g / 2]; mn[g] = m8[g / 2]; }
            const uint8_t *qs = p + (f == F_Q4_K ? 16 : 48), *qh = p + 16;
            for (int c = 0; c < 4; c++)
                for (int l = 0; l < 32; l++) {
                    u[64 * c + l] = qs[32 * c + l] & 15;
                    u[64 * c + 32 + l] = qs[32 * c + l] >> 4;
                }
            if (f == F_Q5_K)
                for (int c = 0; c < 8; c++)
                    for (int l = 0; l < 32; l++) u[32 * c + l] |= ((qh[l] >> c) & 1) << 4;
        } else {                                                    /* Q6_K */
            o->dw[b] = f16(p + 208);
            for (int g = 0; g < 16; g++) sc[g] = (int8_t)p[192 + g];
            for (int half = 0; half < 2; half++)
                for (int k = 0; k < 4; k++)
                    for (int l = 0; l < 32; l++)
                        u[128 * half + 32 * k + l] = ((p[64 * half + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15)
                                                   | (((p[128 + 32 * half + l] >> (2 * k)) & 3) << 4);
        }
        for (int c = 0; c < 8; c++)
            for (int i = 0; i < 8; i++) o->scv[64 * b + 8 * c + i] = sc[2 * c + i / 4];
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

/* one activation row against a decoded K-quant row */
static float row_k(const Row *w, int64_t nb, int z, int mins, const int8_t *q, const float *dx, const int32_t *s16) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *u = w->u + 256 * b;
        const int8_t *qb = q + 256 * b;
        int32_t s1;
#if defined(__AVX2__)
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++)
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(dot32_u(u + 32 * c, qb + 32 * c),
                                                           _mm256_loadu_si256((const __m256i *)(w->scv + 64 * b + 8 * c))));
        s1 = hsum(acc);
#else
        s1 = 0;
        for (int g = 0; g < 16; g++) {
            int32_t s = 0;
            for (int i = 0; i < 16; i++) s += u[16 * g + i] * qb[16 * g + i];
            s1 += w->sc[16 * b + g] * s;
        }
#endif
        int32_t zs = 0, s2 = 0;
        const int32_t *sg = s16 + 16 * b, *sc = w->sc + 16 * b, *mn = w->mn + 16 * b;
        for (int g = 0; g < 16; g++) zs += sc[g] * sg[g];
        if (mins) for (int g = 0; g < 16; g++) s2 += mn[g] * sg[g];
        s1 -= z * zs;
        float a = (w->dw[b] * dx[b]) * (float)s1;
        if (mins) a = a - (w->mw[b] * dx[b]) * (float)s2;
        l[b & 7] = l[b & 7] + a;
    }
    return fold8(l);
}

/* y[r * y_stride + i] = row i of the weight (logical; stored row order[i] when order is given)
 * against activation row r, for r < n. scales: float32 (rows, scale_stride) for int8 / int4-g64. */
void vk_q8_gemv(int f, const uint8_t *w, int64_t row_bytes, const float *scales, int64_t scale_stride,
                const int64_t *order, int64_t rows, int64_t cols,
                const int8_t *q, const float *dx, const int32_t *s16, const int32_t *s32, int64_t n,
                float *y, int64_t y_stride, int threads) {
    const int kq = f >= F_Q2_K, fb = kq ? 256 : 32, z = zero_point(f);
    const int sgn = f == F_Q8_0 || f == F_INT8;
    const int mins = f == F_Q4_1 || f == F_Q5_1 || f == F_Q2_K || f == F_Q4_K || f == F_Q5_K;
    const int64_t nb = cols / fb;
    if (threads <= 0) threads = 1;
    #pragma omp parallel num_threads(threads) if (rows >= 64)
    {
        Row o;
        o.u = aligned_alloc(64, (size_t)((cols + 63) / 64 * 64));
        o.dw = malloc(sizeof(float) * (size_t)nb);
        o.mw = malloc(sizeof(float) * (size_t)nb);
        o.sc = malloc(sizeof(int32_t) * (size_t)(cols / 16 + 1));
        o.mn = malloc(sizeof(int32_t) * (size_t)(cols / 16 + 1));
        o.scv = malloc(sizeof(int32_t) * (size_t)(cols / 4 + 1));
        #pragma omp for schedule(dynamic, 8)
        for (int64_t i = 0; i < rows; i++) {
            int64_t src = order ? order[i] : i;
            decode_row(f, w + src * row_bytes, scales ? scales + src * scale_stride : 0, cols, &o);
            for (int64_t r = 0; r < n; r++) {
                const int8_t *qr = q + r * cols;
                y[r * y_stride + i] = kq ? row_k(&o, nb, z, mins, qr, dx + r * nb, s16 + r * (cols / 16))
                                         : row_b32(&o, nb, z, sgn, mins, qr, dx + r * nb, s32 + r * (cols / 32));
            }
        }
        free(o.u); free(o.dw); free(o.mw); free(o.sc); free(o.mn); free(o.scv);
    }
}
