/* gemm's tiles (qdot_gemm.h includes this with its build's vectors): a weight group's GW rows
 * against LANES activation rows, one per lane. Defined by the includer: LANES, VI / VF (integer
 * and float vectors of LANES 32-bit lanes) and the V_* operations, V_DOT4 the unsigned-by-signed
 * dot of each lane's 4 bytes added into it, V_DOT2 the same of int16 pairs. */

/* y[r][i0 + w] for tile ti's live rows r from each weight row's 8 lanes in L (fold8's order). A
 * row's GW outputs are adjacent in y, its rows a matrix's width apart: written one row at a time,
 * one store each (GW single floats a row, a page apart row to row, filled the store buffer and
 * held up the next tile's arithmetic) */
static inline __attribute__((always_inline)) void tile_store(const Mat *m, int64_t i0, int64_t ti, int64_t n, const float *L) {
    _Static_assert(GW == 8, "a row's outputs are one 8-float store");
    float Y[GW][LANES] __attribute__((aligned(64)));
    for (int w = 0; w < GW; w++) {
        const float *l = L + w * 8 * LANES;
        const VF a0 = VF_ADD(VF_LOAD(l), VF_LOAD(l + 4 * LANES)), a1 = VF_ADD(VF_LOAD(l + LANES), VF_LOAD(l + 5 * LANES));
        const VF a2 = VF_ADD(VF_LOAD(l + 2 * LANES), VF_LOAD(l + 6 * LANES)), a3 = VF_ADD(VF_LOAD(l + 3 * LANES), VF_LOAD(l + 7 * LANES));
        VF_STORE(Y[w], VF_ADD(VF_ADD(a0, a2), VF_ADD(a1, a3)));
    }
    const int live = m->rows - i0 < GW ? (int)(m->rows - i0) : GW;
    for (int r = 0; r < LANES && LANES * ti + r < n; r++) {
        float *y = m->y + (LANES * ti + r) * m->y_stride + i0;
        if (live == GW) {
            _mm256_storeu_ps(y, _mm256_setr_ps(Y[0][r], Y[1][r], Y[2][r], Y[3][r], Y[4][r], Y[5][r], Y[6][r], Y[7][r]));
            continue;
        }
        for (int w = 0; w < live; w++) y[w] = Y[w][r];
    }
}

/* K-quant rows; L: GW x 8 x LANES floats */
static inline __attribute__((always_inline)) void gemm_k_tile(
        const Mat *m, int64_t i0, const Unpacked *g, const Tiles *t, int64_t ti, int64_t n, float *L, const int f) {
    const int64_t nb = m->cols / 256, quads = m->cols / 4;
    const int z = zero_point(f), mins = has_mins(f);
    const int gq = f == F_Q4_K || f == F_Q5_K ? 8 : 4;     /* quads a scale covers: 32 or 16 columns */
    const uint8_t *tq = t->q + ti * quads * 4 * LANES;
    for (int j = 0; j < GW * 8 * LANES; j++) L[j] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        VI T[GW];
        for (int w = 0; w < GW; w++) T[w] = V_ZERO;
        for (int s = 0; s < 64 / gq; s++) {
            VI acc[GW];
            for (int w = 0; w < GW; w++) acc[w] = V_ZERO;
            for (int j = 0; j < gq; j++) {
                const int64_t k = 64 * b + gq * s + j;
                const VI Q = V_LOAD(tq + 4 * LANES * k);
                for (int w = 0; w < GW; w++) {
                    int32_t u;
                    memcpy(&u, g->u + w * m->cols + 4 * k, 4);
                    acc[w] = V_DOT4(acc[w], Q, V_SET1(u));
                }
            }
            for (int w = 0; w < GW; w++)
                T[w] = V_ADD(T[w], V_MULLO(acc[w], V_SET1(g->sc[16 * (w * nb + b) + gq / 4 * s])));
        }
        const int32_t *s16 = t->sums + (ti * nb + b) * 8 * LANES;
        const VF x = VF_LOAD(t->dx + (ti * nb + b) * LANES);
        for (int w = 0; w < GW; w++) {
            const int64_t k = w * nb + b;
            VI mt = V_ZERO;
            for (int p = 0; p < 8; p++) mt = V_DOT2(mt, V_LOAD(s16 + p * LANES), V_SET1(g->m16[8 * k + p]));
            VI s1 = V_SUB(T[w], V_SET1(g->c[k]));
            if (z) s1 = V_SUB(s1, mt);
            VF a = VF_MUL(VF_MUL(VF_SET1(g->dw[k]), x), V_CVT(s1));
            if (mins) a = VF_SUB(a, VF_MUL(VF_MUL(VF_SET1(g->mw[k]), x), V_CVT(mt)));
            float *l = L + (w * 8 + b % 8) * LANES;
            VF_STORE(l, VF_ADD(VF_LOAD(l), a));
        }
    }
    tile_store(m, i0, ti, n, L);
}

/* rows of 32-column blocks: a block's 8 quads, then its float part (row_b32_at's) */
static inline __attribute__((always_inline)) void gemm_b32_tile(
        const Mat *m, int64_t i0, const Unpacked *g, const Tiles *t, int64_t ti, int64_t n, float *L, const int f) {
    const int64_t nb = m->cols / 32, quads = m->cols / 4;
    const int z = zero_point(f), mins = f == F_Q4_1 || f == F_Q5_1;
    const uint8_t *tq = t->q + ti * quads * 4 * LANES;
    for (int j = 0; j < GW * 8 * LANES; j++) L[j] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        VI acc[GW];
        for (int w = 0; w < GW; w++) acc[w] = V_ZERO;
        for (int j = 0; j < 8; j++) {
            const int64_t k = 8 * b + j;
            const VI Q = V_LOAD(tq + 4 * LANES * k);
#if defined(Q8_SIGNED)
            const VI Qs = f == F_Q8_0 ? _mm256_xor_si256(Q, _mm256_set1_epi8((char)0x80)) : Q;   /* q, once */
#endif
            for (int w = 0; w < GW; w++) {
                int32_t u;
                memcpy(&u, g->u + w * m->cols + 4 * k, 4);
#if defined(Q8_SIGNED)
                if (f == F_Q8_0) {
                    acc[w] = V_DOT4_SIGNED(acc[w], Qs, V_SET1(u));
                    continue;
                }
#endif
                acc[w] = V_DOT4(acc[w], Q, V_SET1(u));
            }
        }
        const VI bs = V_LOAD(t->sums + (ti * nb + b) * LANES);
        const VI zs = V_MULLO(bs, V_SET1(z));
        const VF x = VF_LOAD(t->dx + (ti * nb + b) * LANES);
        for (int w = 0; w < GW; w++) {
            const int64_t k = w * nb + b;
            const VI s1 = V_SUB(V_SUB(acc[w], V_SET1(g->c[k])), zs);
            VF a = VF_MUL(VF_MUL(VF_SET1(g->dw[k]), x), V_CVT(s1));
            if (mins) a = VF_ADD(a, VF_MUL(VF_MUL(VF_SET1(g->mw[k]), x), V_CVT(bs)));
            float *l = L + (w * 8 + b % 8) * LANES;
            VF_STORE(l, VF_ADD(VF_LOAD(l), a));
        }
    }
    tile_store(m, i0, ti, n, L);
}
