/* K-quant rows against 16 or more activation rows (AVX-512 VNNI builds; included by qdot.c before
 * its matrix loop): GEMM tiles whose zmm lanes are 16 activation rows, so that a weight row's
 * group scales, zero point, mins and float scales apply to all 16 at once and no lane is summed
 * across. Each output is rows_k_at's value for its one (activation row, weight row) pair:
 *
 * - the integer sums are exact in any order. The activations are stored as q + 128 (vpdpbusd
 *   takes its unsigned bytes from them, its signed ones from the weights' values, which fit
 *   int8), so s1 = sum_g sc_g (u_g . (q_g + 128)) - 128 sum_g sc_g sum(u_g): per 16 columns
 *   |sum| <= 16 x 255 x 63, times |sc| <= 128, over 16 groups, stays below 2**31;
 * - the float part is sb_floats' per lane: (dw dx) s1, then - (mw dx) s2, into lane b mod 8 of
 *   the row's eight from +0, then fold8's order.
 *
 * A weight group (8 rows) is unpacked once into bytes and per-superblock integer scales, then
 * met by every tile of activation rows in turn. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
enum { GT = 16, GW = 8 };           /* activation rows a tile (zmm lanes), weight rows a group */

/* the activation rows of one input, a tile of GT at a time, lane r row 16 t + r (rows past n:
 * q = 0, dx = 0, their outputs never written) */
typedef struct {
    uint8_t *q;         /* [tile][cols / 4][16 lanes][4]: q + 128 */
    float *dx;          /* [tile][superblock][16] */
    int32_t *s16;       /* [tile][superblock][8][16]: int16 pairs (s16[2p], s16[2p + 1]) */
} Tiles;

static int tiles_build(Tiles *t, const Acts *a, int64_t n, int64_t cols) {
    const int64_t nt = (n + GT - 1) / GT, nb = cols / 256, quads = cols / 4;
    t->q = aligned_alloc(64, (size_t)(nt * quads * 64));
    t->dx = aligned_alloc(64, sizeof(float) * (size_t)(nt * nb * GT));
    t->s16 = aligned_alloc(64, sizeof(int32_t) * (size_t)(nt * nb * 8 * GT));
    if (!t->q || !t->dx || !t->s16) return -1;
    for (int64_t ti = 0; ti < nt; ti++)
        for (int r = 0; r < GT; r++) {
            const int64_t row = GT * ti + r;
            uint32_t *dq = (uint32_t *)t->q + ti * quads * GT + r;
            for (int64_t k = 0; k < quads; k++) {
                uint32_t v = 0;
                if (row < n) memcpy(&v, a->q + row * cols + 4 * k, 4);
                dq[k * GT] = v ^ 0x80808080u;
            }
            for (int64_t b = 0; b < nb; b++) {
                t->dx[(ti * nb + b) * GT + r] = row < n ? a->d[row * nb + b] : 0.0f;
                for (int p = 0; p < 8; p++) {
                    uint32_t v = 0;
                    if (row < n) {
                        const int16_t *s = a->s16 + row * (cols / 16) + 16 * b + 2 * p;
                        v = (uint32_t)(uint16_t)s[0] | (uint32_t)(uint16_t)s[1] << 16;
                    }
                    t->s16[((ti * nb + b) * 8 + p) * GT + r] = (int32_t)v;
                }
            }
        }
    return 0;
}

static void tiles_free(Tiles *t) { free(t->q); free(t->dx); free(t->s16); }

/* a weight group unpacked: per row, its values as bytes and per superblock its 16 group scales,
 * 8 int16 pairs of m16 (zero point times scale, or mins), 128 sum_g sc_g sum(u_g), dw and mw */
typedef struct {
    uint8_t *u;         /* [GW][cols] */
    int32_t *sc;        /* [GW][nb][16] */
    int32_t *m16;       /* [GW][nb][8] */
    int32_t *c;         /* [GW][nb] */
    float *dw, *mw;     /* [GW][nb] */
} Unpacked;

static size_t unpacked_bytes(int64_t cols) {
    const size_t nb = (size_t)(cols / 256);
    return GW * ((size_t)cols + nb * (64 + 32 + 4 + 4 + 4)) + 5 * 64;
}

static void unpack_group(const Mat *m, int64_t i0, Unpacked *g, const int f) {
    const int64_t nb = m->cols / 256, bb = BLOCK_BYTES[f];
    const int at = f == F_Q2_K ? 80 : f == F_Q3_K ? 106 : f == F_Q6_K ? 206 : 0, pair = f != F_Q3_K && f != F_Q6_K;
    for (int w = 0; w < GW; w++) {
        const int64_t i = i0 + w < m->rows ? i0 + w : i0;          /* past the last row: row i0 again, unused */
        const uint8_t *row = m->w + (m->order ? m->order[i] : i) * m->row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = row + bb * b;
            const int64_t k = w * nb + b;
            __m256i m16;
            const __m128i sc = sb_groups_held(f, p, &m16);
            __m512i U[4];
            sb_held(f, p, U);
            int64_t sums[32];
            for (int c = 0; c < 4; c++) {
                _mm512_storeu_si512(g->u + w * m->cols + 256 * b + 64 * c, U[c]);
                _mm512_storeu_si512(sums + 8 * c, _mm512_sad_epu8(U[c], _mm512_setzero_si512()));
            }
            _mm512_storeu_si512(g->sc + 16 * k, _mm512_cvtepi8_epi32(sc));
            _mm256_storeu_si256((__m256i *)(g->m16 + 8 * k), m16);
            int32_t s = 0;
            for (int q = 0; q < 16; q++) s += g->sc[16 * k + q] * (int32_t)(sums[2 * q] + sums[2 * q + 1]);
            g->c[k] = 128 * s;
            g->dw[k] = f16(p + at + (pair ? 0 : 2));
            g->mw[k] = pair ? f16(p + at + 2) : 0.0f;
        }
    }
}

/* the group's GW rows against tile ti: y[r][i0 + w] for its live rows; L: GW x 8 x 16 floats */
static inline __attribute__((always_inline)) void gemm_k_tile(
        const Mat *m, int64_t i0, const Unpacked *g, const Tiles *t, int64_t ti, int64_t n, float *L, const int f) {
    const int64_t nb = m->cols / 256, quads = m->cols / 4;
    const int z = zero_point(f), mins = has_mins(f);
    const int gq = f == F_Q4_K || f == F_Q5_K ? 8 : 4;     /* quads a scale covers: 32 or 16 columns */
    const uint8_t *tq = t->q + ti * quads * 64;
    for (int j = 0; j < GW * 8 * GT; j++) L[j] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        __m512i T[GW];
        for (int w = 0; w < GW; w++) T[w] = _mm512_setzero_si512();
        for (int s = 0; s < 64 / gq; s++) {
            __m512i acc[GW];
            for (int w = 0; w < GW; w++) acc[w] = _mm512_setzero_si512();
            for (int j = 0; j < gq; j++) {
                const int64_t k = 64 * b + gq * s + j;
                const __m512i Q = _mm512_load_si512(tq + 64 * k);
                for (int w = 0; w < GW; w++) {
                    int32_t u;
                    memcpy(&u, g->u + w * m->cols + 4 * k, 4);
                    acc[w] = _mm512_dpbusd_epi32(acc[w], Q, _mm512_set1_epi32(u));
                }
            }
            for (int w = 0; w < GW; w++)
                T[w] = _mm512_add_epi32(T[w], _mm512_mullo_epi32(acc[w], _mm512_set1_epi32(g->sc[16 * (w * nb + b) + gq / 4 * s])));
        }
        const __m512i *s16 = (const __m512i *)(t->s16 + (ti * nb + b) * 8 * GT);
        const __m512 x = _mm512_load_ps(t->dx + (ti * nb + b) * GT);
        for (int w = 0; w < GW; w++) {
            const int64_t k = w * nb + b;
            __m512i mt = _mm512_setzero_si512();
            for (int p = 0; p < 8; p++) mt = _mm512_dpwssd_epi32(mt, _mm512_load_si512(s16 + p), _mm512_set1_epi32(g->m16[8 * k + p]));
            __m512i s1 = _mm512_sub_epi32(T[w], _mm512_set1_epi32(g->c[k]));
            if (z) s1 = _mm512_sub_epi32(s1, mt);
            __m512 a = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(g->dw[k]), x), _mm512_cvtepi32_ps(s1));
            if (mins) a = _mm512_sub_ps(a, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(g->mw[k]), x), _mm512_cvtepi32_ps(mt)));
            float *l = L + (w * 8 + b % 8) * GT;
            _mm512_store_ps(l, _mm512_add_ps(_mm512_load_ps(l), a));
        }
    }
    for (int w = 0; w < GW && i0 + w < m->rows; w++) {
        const float *l = L + w * 8 * GT;
        const __m512 a0 = _mm512_add_ps(_mm512_load_ps(l), _mm512_load_ps(l + 4 * GT));
        const __m512 a1 = _mm512_add_ps(_mm512_load_ps(l + GT), _mm512_load_ps(l + 5 * GT));
        const __m512 a2 = _mm512_add_ps(_mm512_load_ps(l + 2 * GT), _mm512_load_ps(l + 6 * GT));
        const __m512 a3 = _mm512_add_ps(_mm512_load_ps(l + 3 * GT), _mm512_load_ps(l + 7 * GT));
        float y[GT];
        _mm512_storeu_ps(y, _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3)));
        for (int r = 0; r < GT && GT * ti + r < n; r++) m->y[(GT * ti + r) * m->y_stride + i0 + w] = y[r];
    }
}

/* weight group gi of m against every tile, one format at a time */
static inline __attribute__((always_inline)) void gemm_k_at(const Mat *m, int64_t gi, const Tiles *t, int64_t n,
                                                            Unpacked *g, float *L, const int f) {
    unpack_group(m, GW * gi, g, f);
    for (int64_t ti = 0; ti < (n + GT - 1) / GT; ti++) gemm_k_tile(m, GW * gi, g, t, ti, n, L, f);
}

/* one instance per format: its shifts, masks and scale groups are constants */
static void gemm_k(const Mat *m, int64_t gi, const Tiles *t, int64_t n, Unpacked *g, float *L) {
    switch (m->fmt) {
    case F_Q2_K: gemm_k_at(m, gi, t, n, g, L, F_Q2_K); return;
    case F_Q3_K: gemm_k_at(m, gi, t, n, g, L, F_Q3_K); return;
    case F_Q4_K: gemm_k_at(m, gi, t, n, g, L, F_Q4_K); return;
    case F_Q5_K: gemm_k_at(m, gi, t, n, g, L, F_Q5_K); return;
    default:     gemm_k_at(m, gi, t, n, g, L, F_Q6_K); return;
    }
}
#endif
