/* Block rows against several activation rows (vector builds; included by qdot.c before its matrix
 * loop): GEMM tiles whose lanes are activation rows (16 in zmm, 8 in ymm), so that a weight row's
 * scales, zero point, mins and float scales apply to all of them at once and no lane is summed
 * across. gemm_k takes K-quant rows; gemm_b32 rows of 32-column blocks (Q4_0, Q4_1, Q5_0, Q5_1
 * and Q8_0). Each output is rows_k_at's or row_b32_at's value for its one (activation row, weight
 * row) pair:
 *
 * - the integer sums are exact in any order. The activations are stored as q + 128 (vpdpbusd
 *   takes its unsigned bytes from them, its signed ones from the weights' values, which fit int8;
 *   AVX2's vpmaddubsw pairs stay below 2 x 255 x 63 < 2**15, unsaturated, for the K-quants'
 *   values), and 128 times the weights' own sums is taken out: a K-quant superblock's
 *   s1 = sum_g sc_g (u_g . (q_g + 128)) - 128 sum_g sc_g sum(u_g), where per 16 columns
 *   |sum| <= 16 x 255 x 63, times |sc| <= 128, over 16 groups, stays below 2**31; a 32-column
 *   block's u . (q + 128) - 128 sum(u), |u . (q + 128)| <= 32 x 255 x 128. Q8_0's signed bytes
 *   against q + 128 would saturate vpmaddubsw (2 x 255 x 128 > 2**15 - 1), so AVX2 without VNNI
 *   takes them the other way round: |u| (at most 128, unsigned) against q with u's sign (vpsignb,
 *   at most 127 in size), pairs at most 2 x 128 x 127 < 2**15, and no 128 sum(u) to take out;
 * - the float part is the row kernels' per lane: for a superblock (dw dx) s1, then - (mw dx) s2;
 *   for a block (dw dx) s1, then + (mw dx) sum(q); into lane b mod 8 of the row's eight from +0,
 *   then fold8's order.
 *
 * A weight group (8 rows) is unpacked once into bytes and per-block integer and float scales,
 * then met by every tile of activation rows in turn. */
#if defined(__AVX2__)
/* Weight rows a group; activation rows a tile, and the fewest rows that take gemm_k (fewer take
 * rows_k): 16 lanes from 16 rows in zmm; 8 lanes from 32 rows in ymm (AVX2's vpmaddubsw
 * route gains over rows_k only there; an 8-lane tile under AVX-512 was slower than rows_k) */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
enum { GW = 8, LANES = 16, GEMM_MIN_ROWS = 16 };
#else
enum { GW = 8, LANES = 8, GEMM_MIN_ROWS = 32 };
#endif
#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__)) && !defined(__AVXVNNI__)
#define Q8_SIGNED 1         /* vpmaddubsw is the dot: Q8_0's tiles meet q, not q + 128 (see above) */
#endif

/* the activation rows of one input quantised with fb-column blocks, a tile of LANES at a time, lane
 * r row LANES t + r (rows past n: q = 0, dx = 0, their outputs never written) */
typedef struct {
    uint8_t *q;         /* [tile][cols / 4][LANES][4]: q + 128 */
    float *dx;          /* [tile][block][LANES] */
    int32_t *sums;      /* [tile][superblock][8][LANES]: int16 pairs (s16[2p], s16[2p + 1]); for
                         * 32-column blocks [tile][block][LANES]: s32 */
} Tiles;

static int tiles_build(Tiles *t, const Acts *a, int64_t n, int64_t cols, int64_t fb) {
    const int64_t lanes = LANES, nt = (n + lanes - 1) / lanes, nb = cols / fb, quads = cols / 4;
    const int64_t per = fb == 256 ? 8 : 1;          /* sums a block */
    t->q = aligned_alloc(64, (size_t)(nt * quads * 4 * lanes));
    t->dx = aligned_alloc(64, (sizeof(float) * (size_t)(nt * nb * lanes) + 63) / 64 * 64);
    t->sums = aligned_alloc(64, (sizeof(int32_t) * (size_t)(nt * nb * per * lanes) + 63) / 64 * 64);
    if (!t->q || !t->dx || !t->sums) return -1;
    for (int64_t ti = 0; ti < nt; ti++)
        for (int r = 0; r < lanes; r++) {
            const int64_t row = lanes * ti + r;
            uint32_t *dq = (uint32_t *)t->q + ti * quads * lanes + r;
            for (int64_t k = 0; k < quads; k++) {
                uint32_t v = 0;
                if (row < n) memcpy(&v, a->q + row * cols + 4 * k, 4);
                dq[k * lanes] = v ^ 0x80808080u;
            }
            for (int64_t b = 0; b < nb; b++) {
                t->dx[(ti * nb + b) * lanes + r] = row < n ? a->d[row * nb + b] : 0.0f;
                if (fb == 32) {
                    t->sums[(ti * nb + b) * lanes + r] = row < n ? a->s32[row * nb + b] : 0;
                    continue;
                }
                for (int p = 0; p < 8; p++) {
                    uint32_t v = 0;
                    if (row < n) {
                        const int16_t *s = a->s16 + row * (cols / 16) + 16 * b + 2 * p;
                        v = (uint32_t)(uint16_t)s[0] | (uint32_t)(uint16_t)s[1] << 16;
                    }
                    t->sums[((ti * nb + b) * 8 + p) * lanes + r] = (int32_t)v;
                }
            }
        }
    return 0;
}

static void tiles_free(Tiles *t) { free(t->q); free(t->dx); free(t->sums); }

/* a weight group unpacked: per row, its values as bytes and per block 128 times its integer sum
 * (K-quants: sum_g sc_g sum(u_g)), dw and mw; per superblock also its 16 group scales and 8 int16
 * pairs of m16 (zero point times scale, or mins) */
typedef struct {
    uint8_t *u;         /* [GW][cols] */
    int32_t *sc;        /* [GW][nb][16] */
    int32_t *m16;       /* [GW][nb][8] */
    int32_t *c;         /* [GW][nb] */
    float *dw, *mw;     /* [GW][nb] */
} Unpacked;

/* its bytes, and the lanes' floats (GW x 8 x LANES), 64-byte aligned pieces, for rows of cols
 * columns in either block size */
static size_t unpacked_bytes(int64_t cols) {
    const size_t nb = (size_t)(cols / 32);
    return GW * ((size_t)cols + nb * (64 + 32 + 4 + 4 + 4)) + sizeof(float) * GW * 8 * LANES + 8 * 64;
}

static void unpacked_carve(char *p, int64_t cols, Unpacked *g, float **L) {
    const size_t nb = (size_t)(cols / 32);
    p = (char *)(((uintptr_t)p + 63) / 64 * 64);
    *L = (float *)p; p += sizeof(float) * GW * 8 * LANES;
    g->u = (uint8_t *)p; p += GW * (size_t)cols;
    g->sc = (int32_t *)p; p += GW * nb * 64;
    g->m16 = (int32_t *)p; p += GW * nb * 32;
    g->c = (int32_t *)p; p += GW * nb * 4;
    g->dw = (float *)p; p += GW * nb * 4;
    g->mw = (float *)p;
}

static const int8_t ONES[256] __attribute__((aligned(64))) = {[0 ... 255] = 1};

static inline __attribute__((always_inline)) void unpack_k(const Mat *m, int64_t i0, Unpacked *g, const int f) {
    const int64_t nb = m->cols / 256, bb = BLOCK_BYTES[f];
    const int at = f == F_Q2_K ? 80 : f == F_Q3_K ? 106 : f == F_Q6_K ? 206 : 0, pair = f != F_Q3_K && f != F_Q6_K;
    for (int w = 0; w < GW; w++) {
        const int64_t i = i0 + w < m->rows ? i0 + w : i0;          /* past the last row: row i0 again, unused */
        const uint8_t *row = m->w + (m->order ? m->order[i] : i) * m->row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = row + bb * b;
            const int64_t k = w * nb + b;
            uint8_t *u = g->u + w * m->cols + 256 * b;
            __m256i m16;
            const __m128i sc = sb_groups_held(f, p, &m16);
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
            __m512i U[4], S[2];
            sb_held(f, p, U);
            for (int c = 0; c < 4; c++) _mm512_storeu_si512(u + 64 * c, U[c]);
            _mm512_storeu_si512(g->sc + 16 * k, _mm512_cvtepi8_epi32(sc));
            lane_scales_held(sc, S);
            const I8 d = sb_dot_held(U, S, ONES);        /* lanes summing to sum_g sc_g sum(u_g) */
#else
            __m256i U[8], S[8];
            sb_values32(f, p, U);
            for (int c = 0; c < 8; c++) _mm256_storeu_si256((__m256i *)(u + 32 * c), U[c]);
            _mm256_storeu_si256((__m256i *)(g->sc + 16 * k), _mm256_cvtepi8_epi32(sc));
            _mm256_storeu_si256((__m256i *)(g->sc + 16 * k + 8), _mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)));
            lane_scales32(sc, S);
            const I8 d = sb_dot(U, S, ONES);
#endif
            _mm256_storeu_si256((__m256i *)(g->m16 + 8 * k), m16);
            int32_t l[8], s = 0;
            _mm256_storeu_si256((__m256i *)l, d);
            for (int q = 0; q < 8; q++) s += l[q];
            g->c[k] = 128 * s;
            g->dw[k] = f16(p + at + (pair ? 0 : 2));
            g->mw[k] = pair ? f16(p + at + 2) : 0.0f;
        }
    }
}

/* rows of 32-column blocks (values32's formats) */
static inline __attribute__((always_inline)) void unpack_b32(const Mat *m, int64_t i0, Unpacked *g, const int f) {
    const int64_t nb = m->cols / 32, bb = BLOCK_BYTES[f];
    const int mins = f == F_Q4_1 || f == F_Q5_1;
    for (int w = 0; w < GW; w++) {
        const int64_t i = i0 + w < m->rows ? i0 + w : i0;
        const uint8_t *row = m->w + (m->order ? m->order[i] : i) * m->row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = row + bb * b;
            const int64_t k = w * nb + b;
            const __m256i v = values32(f, p);
            _mm256_storeu_si256((__m256i *)(g->u + w * m->cols + 32 * b), v);
            /* the sum of its values: Q8_0's signed, by their offset from -128 */
            const __m256i s = _mm256_sad_epu8(f == F_Q8_0 ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v,
                                              _mm256_setzero_si256());
            int64_t l[4];
            _mm256_storeu_si256((__m256i *)l, s);
            g->c[k] = 128 * ((int32_t)(l[0] + l[1] + l[2] + l[3]) - (f == F_Q8_0 ? 32 * 128 : 0));
#if defined(Q8_SIGNED)
            if (f == F_Q8_0) g->c[k] = 0;
#endif
            g->dw[k] = f16(p);
            g->mw[k] = mins ? f16(p + 2) : 0.0f;
        }
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define VI __m512i
#define VF __m512
#define V_ZERO _mm512_setzero_si512()
#define V_LOAD(p) _mm512_load_si512((const void *)(p))
#define V_SET1 _mm512_set1_epi32
#define V_ADD _mm512_add_epi32
#define V_SUB _mm512_sub_epi32
#define V_MULLO _mm512_mullo_epi32
#define V_CVT _mm512_cvtepi32_ps
#define VF_SET1 _mm512_set1_ps
#define VF_LOAD _mm512_load_ps
#define VF_STORE _mm512_store_ps
#define VF_STOREU _mm512_storeu_ps
#define VF_ADD _mm512_add_ps
#define VF_SUB _mm512_sub_ps
#define VF_MUL _mm512_mul_ps
#define V_DOT4 _mm512_dpbusd_epi32
#define V_DOT2 _mm512_dpwssd_epi32
#else
#define VI __m256i
#define VF __m256
#define V_ZERO _mm256_setzero_si256()
#define V_LOAD(p) _mm256_load_si256((const __m256i *)(p))
#define V_SET1 _mm256_set1_epi32
#define V_ADD _mm256_add_epi32
#define V_SUB _mm256_sub_epi32
#define V_MULLO _mm256_mullo_epi32
#define V_CVT _mm256_cvtepi32_ps
#define VF_SET1 _mm256_set1_ps
#define VF_LOAD _mm256_load_ps
#define VF_STORE _mm256_store_ps
#define VF_STOREU _mm256_storeu_ps
#define VF_ADD _mm256_add_ps
#define VF_SUB _mm256_sub_ps
#define VF_MUL _mm256_mul_ps
#if defined(__AVXVNNI__)
#define V_DOT4 _mm256_dpbusd_avx_epi32
#define V_DOT2 _mm256_dpwssd_avx_epi32
#else
#define V_DOT4(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)))
/* Q8_0: the sum of each lane's 4 products q . u, from q in a and u in b */
#define V_DOT4_SIGNED(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16( \
        _mm256_maddubs_epi16(_mm256_abs_epi8(b), _mm256_sign_epi8(a, b)), _mm256_set1_epi16(1)))
#define V_DOT2(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif
#endif
#include "qdot_gemm_tile.h"

/* weight group gi of m against every tile, one format at a time */
static inline __attribute__((always_inline)) void gemm_at(const Mat *m, int64_t gi, const Tiles *t, int64_t n,
                                                          Unpacked *g, float *L, const int f) {
    if (f < F_Q2_K) {
        unpack_b32(m, GW * gi, g, f);
        for (int64_t ti = 0; ti < (n + LANES - 1) / LANES; ti++) gemm_b32_tile(m, GW * gi, g, t, ti, n, L, f);
        return;
    }
    unpack_k(m, GW * gi, g, f);
    for (int64_t ti = 0; ti < (n + LANES - 1) / LANES; ti++) gemm_k_tile(m, GW * gi, g, t, ti, n, L, f);
}

/* whether gemm takes a matrix of format f for n rows (else the row kernels) */
static inline int gemm_takes(int f, int64_t n) {
    return (f <= F_Q8_0 || f >= F_Q2_K) && n >= GEMM_MIN_ROWS;
}

/* one instance per format: its shifts, masks and scales are constants */
static void gemm(const Mat *m, int64_t gi, const Tiles *t, int64_t n, Unpacked *g, float *L) {
    switch (m->fmt) {
    case F_Q4_0: gemm_at(m, gi, t, n, g, L, F_Q4_0); return;
    case F_Q4_1: gemm_at(m, gi, t, n, g, L, F_Q4_1); return;
    case F_Q5_0: gemm_at(m, gi, t, n, g, L, F_Q5_0); return;
    case F_Q5_1: gemm_at(m, gi, t, n, g, L, F_Q5_1); return;
    case F_Q8_0: gemm_at(m, gi, t, n, g, L, F_Q8_0); return;
    case F_Q2_K: gemm_at(m, gi, t, n, g, L, F_Q2_K); return;
    case F_Q3_K: gemm_at(m, gi, t, n, g, L, F_Q3_K); return;
    case F_Q4_K: gemm_at(m, gi, t, n, g, L, F_Q4_K); return;
    case F_Q5_K: gemm_at(m, gi, t, n, g, L, F_Q5_K); return;
    default:     gemm_at(m, gi, t, n, g, L, F_Q6_K); return;
    }
}
#endif
