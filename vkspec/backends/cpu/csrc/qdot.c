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
 * Vector builds read a K-quant row from its bytes straight into registers,
 * one superblock at a time for every activation row of the call (rows_k),
 * and a 32-column-block row the same way when one row is fed (row_b32_raw);
 * with more rows such a row is decoded once into bytes (decode_row) and
 * shared. Plain C decodes every row. Each row's bits stay its own.
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

#include "qdot_decode.h"

/* ---- activations: exact.quantize_q8 and q8_sums ------------------------------------ */

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

/* ---- the integer dot of 32 bytes: the one place the instruction sets differ ---------- */

#if defined(__AVX2__)
typedef __m256i I8;              /* 8 int32 lanes: lane i sums bytes 4i..4i+3 */

static inline I8 dot32_rr(__m256i a, __m256i b) {        /* unsigned a <= 63 (no saturation on AVX2), signed b */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

static inline I8 dot32_ur(__m256i a, const int8_t *q) { return dot32_rr(a, _mm256_loadu_si256((const __m256i *)q)); }

static inline I8 dot32_sr(__m256i a, const int8_t *q) {   /* signed weights: |w| * sign(w) q */
    return dot32_rr(_mm256_abs_epi8(a), _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)q), a));
}


static inline I8 hsum8(const I8 *p) {          /* lane k: the sum of p[k]'s eight lanes */
    __m256i ab = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i cd = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}
#endif

#if !defined(__AVX2__)
static inline int32_t dot32(const uint8_t *u, const int8_t *q, int sgn) {
    int32_t s = 0;
    if (sgn) for (int i = 0; i < 32; i++) s += (int8_t)u[i] * q[i];
    else for (int i = 0; i < 32; i++) s += u[i] * q[i];
    return s;
}
#endif

static inline float fold8(const float *l) {
    float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
    float b0 = a0 + a2, b1 = a1 + a3;
    return b0 + b1;
}

#if defined(__AVX2__)
/* block k's 32 values: raw < 0, from the decoded row; else from its bytes in format raw (constant) */
static inline __attribute__((always_inline)) __m256i block32(const Row *w, int64_t k, int raw) {
    if (raw < 0) return _mm256_loadu_si256((const __m256i *)(w->u + 32 * k));
    return values32(raw, w->raw + (int64_t)BLOCK_BYTES[raw] * k);
}

/* one activation row against a 32-column-block row. 8 blocks at a time, the last group masked: a
 * missing block adds (0 x 0) x 0 = +0 to its lane, which changes no bit (a lane is never -0); a
 * row of 18 blocks (SmolLM2's 576 columns) spent a quarter of its time in a scalar tail */
static inline __attribute__((always_inline)) float row_b32_at(const Row *w, int64_t nb, int z, int sgn, int mins,
                                                              const int8_t *q, const float *dx, const int32_t *s32, int raw) {
    float l[8];
    __m256 lanes = _mm256_setzero_ps();
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t b = 0; b < nb; b += 8) {
        const int cnt = nb - b < 8 ? (int)(nb - b) : 8;
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), iota);
        I8 p[8];
        for (int k = 0; k < 8; k++) {
            if (k >= cnt) { p[k] = _mm256_setzero_si256(); continue; }
            const __m256i v = block32(w, b + k, raw);
            p[k] = sgn ? dot32_sr(v, q + 32 * (b + k)) : dot32_ur(v, q + 32 * (b + k));
        }
        __m256 dw, mw;
        if (raw < 0) {
            dw = _mm256_maskload_ps(w->dw + b, m);
            mw = _mm256_maskload_ps(w->mw + b, m);
        } else {            /* d, then m where the format has one: the block's first word */
            const __m256i wd = block_words(w->raw + BLOCK_BYTES[raw] * b, BLOCK_BYTES[raw], cnt);
            dw = _mm256_cvtph_ps(low_words(wd));
            mw = _mm256_cvtph_ps(low_words(_mm256_srli_epi32(wd, 16)));
        }
        __m256i bs = _mm256_maskload_epi32(s32 + b, m);
        __m256i s1 = _mm256_sub_epi32(hsum8(p), _mm256_mullo_epi32(bs, _mm256_set1_epi32(z)));
        __m256 x = _mm256_maskload_ps(dx + b, m);
        __m256 a = _mm256_mul_ps(_mm256_mul_ps(dw, x), _mm256_cvtepi32_ps(s1));
        if (mins) a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(mw, x), _mm256_cvtepi32_ps(bs)));
        lanes = _mm256_add_ps(lanes, a);
    }
    _mm256_storeu_ps(l, lanes);
    return fold8(l);
}

static float row_b32(const Row *w, int64_t nb, int z, int sgn, int mins, const int8_t *q, const float *dx, const int32_t *s32) {
    return row_b32_at(w, nb, z, sgn, mins, q, dx, s32, -1);
}

/* the same from the row's bytes, for the formats values32 reads (one activation row: decoding the
 * row into bytes first cost about as much as its dot) */
static float row_b32_raw(const Row *w, int64_t nb, int z, int sgn, int mins, const int8_t *q, const float *dx, const int32_t *s32) {
    switch (w->fmt) {
    case F_Q4_0: return row_b32_at(w, nb, z, sgn, mins, q, dx, s32, F_Q4_0);
    case F_Q4_1: return row_b32_at(w, nb, z, sgn, mins, q, dx, s32, F_Q4_1);
    case F_Q5_0: return row_b32_at(w, nb, z, sgn, mins, q, dx, s32, F_Q5_0);
    case F_Q5_1: return row_b32_at(w, nb, z, sgn, mins, q, dx, s32, F_Q5_1);
    default:     return row_b32_at(w, nb, z, sgn, mins, q, dx, s32, F_Q8_0);
    }
}
#else
/* one activation row against a decoded 32-column-block row */
static float row_b32(const Row *w, int64_t nb, int z, int sgn, int mins,
                     const int8_t *q, const float *dx, const int32_t *s32) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t b = 0; b < nb; b++) {
        int32_t s1 = dot32(w->u + 32 * b, q + 32 * b, sgn) - z * s32[b];
        float a = (w->dw[b] * dx[b]) * (float)s1;
        if (mins) a = a + (w->mw[b] * dx[b]) * (float)s32[b];
        l[b & 7] = l[b & 7] + a;
    }
    return fold8(l);
}
#endif


#if defined(__AVX2__)
#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
/* int32 lanes whose sum is sum_g sc_g * (u . q over group g) for one 256-column superblock, its
 * values and lane scales in registers (U[c], S[c]: columns 32c .. 32c + 31) */
static inline I8 sb_dot(const __m256i *U, const __m256i *S, const int8_t *q) {
    __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int c = 0; c < 8; c++) {
        const __m256i qc = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
#if defined(__AVXVNNI__)
        acc[c & 1] = _mm256_dpwssd_avx_epi32(acc[c & 1], _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), U[c], qc), S[c]);
#else
        acc[c & 1] = _mm256_add_epi32(acc[c & 1], _mm256_madd_epi16(_mm256_maddubs_epi16(U[c], qc), S[c]));
#endif
    }
    return _mm256_add_epi32(acc[0], acc[1]);
}
#endif

/* int32 lanes whose sum is sum_g a_g * b_g over 16 groups, both int16 */
static inline I8 dot16(const int16_t *a, const int16_t *b) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a), _mm256_loadu_si256((const __m256i *)b));
}
#endif

#if !defined(__AVX2__)
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

/* every activation row against a K-quant row read from its bytes: superblocks outer, rows inner,
 * so that a superblock's values and lane scales are made once for all the rows (L1's load ports,
 * not the arithmetic, bound the rows-outer order). Groups of 8 superblocks, one float lane each; a
 * row's last group may be short (Qwen3-MoE's experts: 3 superblocks a row): its missing lanes
 * add +0, which changes no bit (a lane starts at +0 and is never -0).
 * P: 8 n vectors, L: 8 n floats of scratch. */
static inline __attribute__((always_inline)) void rows_k_at(
        const Row *w, int64_t nb, int z, int mins, const int8_t *q, const float *dx, const int16_t *s16,
        int64_t n, int64_t cols, float *y, int64_t ys, I8 *P, float *L, const int f) {
    const int bb = BLOCK_BYTES[f];
    for (int64_t r = 0; r < 8 * n; r++) L[r] = 0.0f;
    const I8 none = _mm256_setzero_si256();
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t b = 0; b < nb; b += 8) {
        const int rem = nb - b < 8 ? (int)(nb - b) : 8;
        const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), iota);
        __m256 dw, mw;
        __m256i m16[8];           /* per superblock and group, what multiplies the group's sum of q */
        sb_floats_held(f, w->raw + bb * b, bb, rem, &dw, &mw);
        for (int j = 0; j < rem; j++) {
            const uint8_t *raw = w->raw + bb * (b + j);
            const __m128i g = sb_groups_held(f, raw, &m16[j]);
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
            __m512i U[4], S[4];
            sb_held(f, raw, U);
            lane_scales_held(g, S);
            for (int64_t r = 0; r < n; r++) P[8 * r + j] = sb_dot_held(U, S, q + r * cols + 256 * (b + j));
#else
            __m256i U[8], S[8];
            sb_values32(f, raw, U);
            for (int c = 0; c < 8; c++) S[c] = lane_scale32(g, c);
            for (int64_t r = 0; r < n; r++) P[8 * r + j] = sb_dot(U, S, q + r * cols + 256 * (b + j));
#endif
        }
        for (int64_t r = 0; r < n; r++) {
            const int16_t *sr = s16 + r * (cols / 16) + 16 * b;
            I8 t[8];
            for (int j = 0; j < 8; j++) {
                t[j] = j < rem ? dot16((const int16_t *)&m16[j], sr + 16 * j) : none;
                if (j >= rem) P[8 * r + j] = none;
            }
            __m256i s1 = hsum8(P + 8 * r), s2 = _mm256_setzero_si256();
            if (z) s1 = _mm256_sub_epi32(s1, hsum8(t));
            if (mins) s2 = hsum8(t);
            __m256 x = _mm256_maskload_ps(dx + r * nb + b, live);
            __m256 a = _mm256_mul_ps(_mm256_mul_ps(dw, x), _mm256_cvtepi32_ps(s1));
            if (mins) a = _mm256_sub_ps(a, _mm256_mul_ps(_mm256_mul_ps(mw, x), _mm256_cvtepi32_ps(s2)));
            _mm256_storeu_ps(L + 8 * r, _mm256_add_ps(_mm256_loadu_ps(L + 8 * r), a));
        }
    }
    for (int64_t r = 0; r < n; r++) y[r * ys] = fold8(L + 8 * r);
}

/* one instance per format: its shift counts, masks and permutations are constants the loops hoist */
static void rows_k(const Row *w, int64_t nb, int z, int mins, const int8_t *q, const float *dx, const int16_t *s16,
                   int64_t n, int64_t cols, float *y, int64_t ys, I8 *P, float *L) {
    switch (w->fmt) {
    case F_Q2_K: rows_k_at(w, nb, z, mins, q, dx, s16, n, cols, y, ys, P, L, F_Q2_K); return;
    case F_Q3_K: rows_k_at(w, nb, z, mins, q, dx, s16, n, cols, y, ys, P, L, F_Q3_K); return;
    case F_Q4_K: rows_k_at(w, nb, z, mins, q, dx, s16, n, cols, y, ys, P, L, F_Q4_K); return;
    case F_Q5_K: rows_k_at(w, nb, z, mins, q, dx, s16, n, cols, y, ys, P, L, F_Q5_K); return;
    default:     rows_k_at(w, nb, z, mins, q, dx, s16, n, cols, y, ys, P, L, F_Q6_K); return;
    }
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
    o->raw = m->w + src * m->row_bytes;
    o->fmt = f;
    o->block_bytes = BLOCK_BYTES[f];
#if defined(__AVX2__)
    if (kq) {                  /* read from the row's bytes, not decoded */
        rows_k(o, nb, z, mins, a->q, a->d, a->s16, n, cols, m->y + i, m->y_stride, (I8 *)P, L);
        return;
    }
#endif
#if defined(__AVX2__)
    if (n == 1 && f <= F_Q8_0) {
        m->y[i] = row_b32_raw(o, nb, z, sgn, mins, a->q, a->d, a->s32);
        return;
    }
#endif
    decode_row(f, o->raw, m->scales ? m->scales + src * m->scale_stride : 0, cols, o);
#if defined(__AVX2__)
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

/* An input of a call: n rows of cols float32, quantised once per block size its matrices need. */
typedef struct { const float *x; int64_t n, cols; Acts a[2]; } Input;

static int quantize_input(Input *in, const int need[2]) {
    for (int kq = 0; kq < 2; kq++) {
        if (!need[kq]) continue;
        const int64_t fb = kq ? 256 : 32, n = in->n, cols = in->cols;
        Acts *a = &in->a[kq];
        a->q = malloc((size_t)(n * cols));
        a->d = malloc(sizeof(float) * (size_t)(n * (cols / fb)));
        a->s16 = malloc(sizeof(int16_t) * (size_t)(n * (cols / 16) + 16));
        a->s32 = malloc(sizeof(int32_t) * (size_t)(n * (cols / 32) + 8));
        if (!a->q || !a->d || !a->s16 || !a->s32) return -1;
        vk_q8_quantize(in->x, n, cols, fb, a->q, a->d, a->s16, a->s32);
    }
    return 0;
}

/* every matrix k against input ins[at[k]], in one parallel region: each matrix's rows shared out
 * among the threads with no barrier between matrices. Returns 0, or -1 when memory runs out
 * (nothing written). */
static int run(const Mat *mats, int count, Input *ins, int nin, const int *at, int threads) {
    int failed = 0;
    int64_t total = 0, cols = 0, n = 0;
    for (int i = 0; i < nin && !failed; i++) {
        int need[2] = {0, 0};
        for (int k = 0; k < count; k++)
            if (at[k] == i) need[mats[k].fmt >= F_Q2_K] = 1;
        failed = quantize_input(&ins[i], need);
        cols = ins[i].cols > cols ? ins[i].cols : cols;
        n = ins[i].n > n ? ins[i].n : n;
    }
    for (int k = 0; k < count; k++) total += mats[k].rows;
    if (threads <= 0) threads = 1;
    if (total < 64) threads = 1;
    /* every thread's scratch in one block, carved by thread number: no allocation, no barrier
     * inside the parallel region */
    const size_t a64 = 64, su = (size_t)(cols + 63) / 64 * 64, sf = (sizeof(float) * (size_t)(cols / 32 + 1) + 63) / 64 * 64,
                 s8 = ((size_t)(cols / 16 + 16) + 63) / 64 * 64,
                 sp = 32 * (size_t)(8 * n + 8),
                 sl = (sizeof(float) * (size_t)(8 * n + 8) + 63) / 64 * 64;
    /* whole pages a thread, a page apart: neighbouring threads' scratch on shared or adjacent lines
     * cost a third of the 2-thread rate (the adjacent-line prefetcher pairs lines across them) */
    const size_t per = (su + 2 * sf + 2 * s8 + sp + sl + 4095) / 4096 * 4096 + 4096;
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
        void *P = p; p += sp;
        float *L = (float *)p;
        for (int k = 0; k < count && !failed; k++) {
            const Mat *m = &mats[k];
            const Input *in = &ins[at[k]];
            /* long runs of rows a thread: the hardware prefetchers follow one stream a thread
             * (8-row chunks handed out in turn read at half the bandwidth) */
            int64_t chunk = m->rows / (4 * threads);
            chunk = chunk < 8 ? 8 : chunk > 256 ? 256 : chunk;
            #pragma omp for schedule(dynamic, chunk) nowait
            for (int64_t i = 0; i < m->rows; i++) one_row(m, i, &in->a[m->fmt >= F_Q2_K], in->n, &o, P, L);
        }
    }
    free(scratch);
    for (int i = 0; i < nin; i++)
        for (int kq = 0; kq < 2; kq++) { free(ins[i].a[kq].q); free(ins[i].a[kq].d); free(ins[i].a[kq].s16); free(ins[i].a[kq].s32); }
    return failed ? -1 : 0;
}

/* The matrices one input x (n rows of cols float32) feeds, in one call. */
int vk_q8_gemvs(const Mat *mats, int count, const float *x, int64_t n, int threads) {
    if (count <= 0 || n <= 0) return 0;
    Input in = {x, n, mats[0].cols, {{0}, {0}}};
    int *at = calloc((size_t)count, sizeof(int));
    const int r = at ? run(mats, count, &in, 1, at, threads) : -1;
    free(at);
    return r;
}

/* Matrix k against its own input xs[k] (ns[k] rows of its cols), in one call: a MoE layer's
 * expert downs, each fed by its own expert. */
int vk_q8_gemvs_each(const Mat *mats, int count, const float *const *xs, const int64_t *ns, int threads) {
    if (count <= 0) return 0;
    Input *ins = calloc((size_t)count, sizeof(Input));
    int *at = calloc((size_t)count, sizeof(int));
    int r = -1;
    if (ins && at) {
        for (int k = 0; k < count; k++) { ins[k].x = xs[k]; ins[k].n = ns[k]; ins[k].cols = mats[k].cols; at[k] = k; }
        r = run(mats, count, ins, count, at, threads);
    }
    free(ins);
    free(at);
    return r;
}
