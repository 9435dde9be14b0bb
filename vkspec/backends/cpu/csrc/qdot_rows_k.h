/* K-quant rows against q8 activation rows (included by qdot.c once, after the 32-column-block
 * rows and before the matrix loop): a superblock's integer sums (plain C from decoded bytes;
 * vector builds from its bytes held in registers, for every activation row at once), their
 * float parts in exact.py's order, rows of fewer than 8 superblocks taken several to a group
 * of 8, and the span functions that run a chunk of rows a call. */
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
    const __m512i z = _mm512_setzero_si512();
    const __m512i d0 = _mm512_dpbusd_epi32(z, U[0], _mm512_loadu_si512(q));
    const __m512i d1 = _mm512_dpbusd_epi32(z, U[1], _mm512_loadu_si512(q + 64));
    const __m512i d2 = _mm512_dpbusd_epi32(z, U[2], _mm512_loadu_si512(q + 128));
    const __m512i d3 = _mm512_dpbusd_epi32(z, U[3], _mm512_loadu_si512(q + 192));
    __m512i a = _mm512_dpwssd_epi32(z, _mm512_packs_epi32(d0, d1), S[0]);    /* lane_scales_held */
    a = _mm512_dpwssd_epi32(a, _mm512_packs_epi32(d2, d3), S[1]);
    return _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
}
#endif

/* one superblock, read from its bytes into registers, against every activation row: P[8 r + j]
 * for activation row r from column col0; m16: what multiplies its groups' sums of q */
static inline __attribute__((always_inline)) void sb_rows(
        const int f, const uint8_t *raw, const int8_t *q, int64_t n, int64_t cols, int64_t col0, I8 *P, int j,
        __m256i *m16) {
    const __m128i g = sb_groups_held(f, raw, m16);
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    __m512i U[4], S[2];
    sb_held(f, raw, U);
    lane_scales_held(g, S);
    for (int64_t r = 0; r < n; r++) P[8 * r + j] = sb_dot_held(U, S, q + r * cols + col0);
#else
    __m256i U[8], S[8];
    sb_values32(f, raw, U);
    lane_scales32(g, S);
    if (n == 1) {           /* straight-line: each register made where it is used (16 held spill) */
        P[j] = sb_dot(U, S, q + col0);
        return;
    }
    for (int64_t r = 0; r < n; r++) P[8 * r + j] = sb_dot(U, S, q + r * cols + col0);
#endif
}

/* the float parts of up to 8 superblocks for one activation row, lane j: (dw dx) s1 - (mw dx) s2,
 * from their integer lanes Pr, their m16 against the row's group sums at sr[j], and dx in x; lanes
 * from `used` on are +0 */
static inline __attribute__((always_inline)) __m256 sb_floats(
        I8 *Pr, const __m256i *m16, const int16_t *const *sr, int used, int z, int mins,
        __m256 dw, __m256 mw, __m256 x) {
    const I8 none = _mm256_setzero_si256();
    I8 t[8];
    for (int j = 0; j < 8; j++) {
        t[j] = j < used ? dot16((const int16_t *)&m16[j], sr[j]) : none;
        if (j >= used) Pr[j] = none;
    }
    __m256i s1 = hsum8(Pr), s2 = _mm256_setzero_si256();
    if (z) s1 = _mm256_sub_epi32(s1, hsum8(t));
    if (mins) s2 = hsum8(t);
    __m256 a = _mm256_mul_ps(_mm256_mul_ps(dw, x), _mm256_cvtepi32_ps(s1));
    if (mins) a = _mm256_sub_ps(a, _mm256_mul_ps(_mm256_mul_ps(mw, x), _mm256_cvtepi32_ps(s2)));
    return a;
}

/* every activation row against a K-quant row read from its bytes: superblocks outer, rows inner,
 * so that a superblock's values and lane scales are made once for all the rows (L1's load ports,
 * not the arithmetic, bound the rows-outer order). Groups of 8 superblocks, one float lane each; a
 * row's last group may be short: its missing lanes add +0, which changes no bit (a lane starts at
 * +0 and is never -0). P: 8 n vectors, L: 8 n floats of scratch. */
static inline __attribute__((always_inline)) void rows_k_at(
        const Row *w, int64_t nb, int z, int mins, const int8_t *q, const float *dx, const int16_t *s16,
        int64_t n, int64_t cols, float *y, int64_t ys, I8 *P, float *L, const int f) {
    const int bb = BLOCK_BYTES[f];
    __m256 one = _mm256_setzero_ps();           /* n == 1: the row's lanes stay in a register */
    if (n > 1)
        for (int64_t r = 0; r < 8 * n; r++) L[r] = 0.0f;
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t b = 0; b < nb; b += 8) {
        const int rem = nb - b < 8 ? (int)(nb - b) : 8;
        const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), iota);
        __m256 dw, mw;
        __m256i m16[8];
        /* the integer parts first, in the bytes' order: reading the 8 float scales first touched 8
         * superblocks' lines ahead of the stream, and one thread waited on memory for most of a row */
        for (int j = 0; j < rem; j++) {
            if (n > 1 || PREFETCH_ONE) prefetch_ahead(w->raw + bb * (b + j), bb);
            sb_rows(f, w->raw + bb * (b + j), q, n, cols, 256 * (b + j), P, j, &m16[j]);
        }
        sb_floats_held(f, w->raw + bb * b, bb, rem, &dw, &mw);
        for (int64_t r = 0; r < n; r++) {
            const int16_t *sr[8];
            for (int j = 0; j < 8; j++) sr[j] = s16 + r * (cols / 16) + 16 * (b + j);
            const __m256 a = sb_floats(P + 8 * r, m16, sr, rem, z, mins, dw, mw,
                                       _mm256_maskload_ps(dx + r * nb + b, live));
            if (n == 1) one = _mm256_add_ps(one, a);
            else _mm256_storeu_ps(L + 8 * r, _mm256_add_ps(_mm256_loadu_ps(L + 8 * r), a));
        }
    }
    if (n == 1) {
        y[0] = fold8_lanes(one);
        return;
    }
    for (int64_t r = 0; r < n; r++) y[r * ys] = fold8(L + 8 * r);
}

/* g rows of nb < 8 superblocks each (an expert's down: 2 or 3), stored one after another, as one
 * group of g nb superblocks: slot j is superblock j % nb of row j / nb. Row k's value is fold8 of
 * lanes +0 + (its superblock b's float part) for b < nb and +0 for the rest: the bits rows_k_at
 * gives the row alone, for a row's worth of sums and folds per group instead of per row. */
static inline __attribute__((always_inline)) void rows_k_short_at(
        const uint8_t *raw, int64_t nb, int g, int z, int mins, const int8_t *q, const float *dx,
        const int16_t *s16, int64_t n, int64_t cols, float *y, int64_t ys, I8 *P, const int f) {
    const int bb = BLOCK_BYTES[f], slots = g * (int)nb;
    __m256 dw, mw;
    __m256i m16[8];
    for (int j = 0; j < slots; j++) {
        if (n > 1 || PREFETCH_ONE) prefetch_ahead(raw + bb * j, bb);
        sb_rows(f, raw + bb * j, q, n, cols, 256 * (j % nb), P, j, &m16[j]);
    }
    sb_floats_held(f, raw, bb, slots, &dw, &mw);     /* after: as in rows_k_at */
    for (int64_t r = 0; r < n; r++) {
        const int16_t *sr[8];
        float xs[8], a[8];
        for (int j = 0; j < 8; j++) {
            sr[j] = s16 + r * (cols / 16) + 16 * (j % nb);
            xs[j] = j < slots ? dx[r * nb + j % nb] : 0.0f;
        }
        _mm256_storeu_ps(a, sb_floats(P + 8 * r, m16, sr, slots, z, mins, dw, mw, _mm256_loadu_ps(xs)));
        for (int k = 0; k < g; k++) {
            float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int b = 0; b < nb; b++) l[b] = l[b] + a[k * nb + b];
            y[r * ys + k] = fold8(l);
        }
    }
}

/* groups g0 .. g1 - 1 of a matrix of `rows` rows (group gi: rows g gi .. g gi + g - 1, the last
 * one possibly short), the loop inside the format's instance: its constants made once a span */
static inline __attribute__((always_inline)) void rows_k_short_span_at(
        const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t g0, int64_t g1, int64_t nb, int g, const int8_t *q,
        const float *dx, const int16_t *s16, int64_t n, int64_t cols, float *y, int64_t ys, I8 *P, const int f) {
    for (int64_t gi = g0; gi < g1; gi++) {
        const int64_t i0 = gi * g;
        rows_k_short_at(w + i0 * row_bytes, nb, rows - i0 < g ? (int)(rows - i0) : g, zero_point(f), has_mins(f), q, dx,
                        s16, n, cols, y + i0, ys, P, f);
    }
}

static void rows_k_short(const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t g0, int64_t g1, int fmt, int64_t nb,
                         int g, const int8_t *q, const float *dx, const int16_t *s16, int64_t n, int64_t cols, float *y,
                         int64_t ys, I8 *P) {
    switch (fmt) {
    case F_Q2_K: rows_k_short_span_at(w, row_bytes, rows, g0, g1, nb, g, q, dx, s16, n, cols, y, ys, P, F_Q2_K); return;
    case F_Q3_K: rows_k_short_span_at(w, row_bytes, rows, g0, g1, nb, g, q, dx, s16, n, cols, y, ys, P, F_Q3_K); return;
    case F_Q4_K: rows_k_short_span_at(w, row_bytes, rows, g0, g1, nb, g, q, dx, s16, n, cols, y, ys, P, F_Q4_K); return;
    case F_Q5_K: rows_k_short_span_at(w, row_bytes, rows, g0, g1, nb, g, q, dx, s16, n, cols, y, ys, P, F_Q5_K); return;
    default:     rows_k_short_span_at(w, row_bytes, rows, g0, g1, nb, g, q, dx, s16, n, cols, y, ys, P, F_Q6_K); return;
    }
}

/* rows i0 .. i1 - 1 of a K-quant matrix against n activation rows (rows_k_at, each row's own bits): the
 * loop inside the format's instance, so that its constants are made once a span, not once a row */
static inline __attribute__((always_inline)) void rows_k_span_at(const Mat *m, int64_t i0, int64_t i1, const Acts *a,
                                                                 int64_t n, void *P, float *L, const int f) {
    Row o;
    o.fmt = f;
    o.block_bytes = BLOCK_BYTES[f];
    for (int64_t i = i0; i < i1; i++) {
        o.raw = m->w + (m->order ? m->order[i] : i) * m->row_bytes;
        rows_k_at(&o, m->cols / 256, zero_point(f), has_mins(f), a->q, a->d, a->s16, n, m->cols, m->y + i, m->y_stride,
                  (I8 *)P, L, f);
    }
}

static void rows_k_span(const Mat *m, int64_t i0, int64_t i1, const Acts *a, int64_t n, void *P, float *L) {
    switch (m->fmt) {
    case F_Q2_K: rows_k_span_at(m, i0, i1, a, n, P, L, F_Q2_K); return;
    case F_Q3_K: rows_k_span_at(m, i0, i1, a, n, P, L, F_Q3_K); return;
    case F_Q4_K: rows_k_span_at(m, i0, i1, a, n, P, L, F_Q4_K); return;
    case F_Q5_K: rows_k_span_at(m, i0, i1, a, n, P, L, F_Q5_K); return;
    default:     rows_k_span_at(m, i0, i1, a, n, P, L, F_Q6_K); return;
    }
}
#endif
