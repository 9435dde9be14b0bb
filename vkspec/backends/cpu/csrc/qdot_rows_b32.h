/* 32-column-block rows (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; int8 and int4-g64 decoded) against q8
 * activation rows (included by qdot.c once, after the types and before the K-quant rows): one
 * activation row reads a row's blocks from their bytes (rows_b32_span), more rows decode the row
 * once into bytes and share it (rows_b32_n_span); the span functions run a chunk of rows a call, the loop
 * inside each format's instance so that its constants are made once a chunk. */
#if defined(__AVX2__)
/* block k's 32 values: raw < 0, from the decoded row; else from its bytes in format raw (constant) */
static inline __attribute__((always_inline)) __m256i block32(const Row *w, int64_t k, int raw) {
    if (raw < 0) return _mm256_loadu_si256((const __m256i *)(w->u + 32 * k));
    return values32(raw, w->raw + (int64_t)BLOCK_BYTES[raw] * k);
}

/* a group's float part for one activation row, in exact.py's order: (dw dx) s1 [+ (mw dx) bs], with
 * s1 = the blocks' integer sums p less z times their q sums bs; lanes past the mask's are +0 */
static inline __attribute__((always_inline)) __m256 floats_b32(const I8 *p, __m256 dw, __m256 mw, const int32_t *s32,
                                                               const float *dx, __m256i m, int z, int mins) {
    const __m256i bs = _mm256_maskload_epi32(s32, m);
    const __m256i s1 = _mm256_sub_epi32(hsum8(p), _mm256_mullo_epi32(bs, _mm256_set1_epi32(z)));
    const __m256 x = _mm256_maskload_ps(dx, m);
    __m256 a = _mm256_mul_ps(_mm256_mul_ps(dw, x), _mm256_cvtepi32_ps(s1));
    if (mins) a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(mw, x), _mm256_cvtepi32_ps(bs)));
    return a;
}

/* the float scales d and m (where the format has one) of cnt blocks from their bytes: each block's first word */
static inline __attribute__((always_inline)) void scales_b32(const uint8_t *raw, int bb, int cnt, __m256 *dw, __m256 *mw) {
    const __m256i wd = block_words(raw, bb, cnt);
    *dw = _mm256_cvtph_ps(low_words(wd));
    *mw = _mm256_cvtph_ps(low_words(_mm256_srli_epi32(wd, 16)));
}

/* the float parts of blocks b .. b + cnt - 1 of a row, lane k block b + k's ((0 x 0) x 0 = +0 past cnt) */
static inline __attribute__((always_inline)) __m256 group_b32(const Row *w, int64_t b, const int cnt, __m256i iota, int z,
                                                              int sgn, int mins, const int8_t *q, const float *dx,
                                                              const int32_t *s32, int raw) {
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), iota);
    if (PREFETCH_ONE && raw >= 0) prefetch_ahead(w->raw + BLOCK_BYTES[raw] * b, 8 * BLOCK_BYTES[raw]);
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
    } else {
        scales_b32(w->raw + BLOCK_BYTES[raw] * b, BLOCK_BYTES[raw], cnt, &dw, &mw);
    }
    return floats_b32(p, dw, mw, s32 + b, dx + b, m, z, mins);
}

/* one activation row against a 32-column-block row. 8 blocks at a time, the last group masked: a
 * missing block adds (0 x 0) x 0 = +0 to its lane, which changes no bit (a lane is never -0); a
 * row of 18 blocks (SmolLM2's 576 columns) spent a quarter of its time in a scalar tail. The whole
 * groups have their own instance, with no counts to test (a 2048-column Q4_0 row 7% faster) */
static inline __attribute__((always_inline)) float row_b32_at(const Row *w, int64_t nb, int z, int sgn, int mins,
                                                              const int8_t *q, const float *dx, const int32_t *s32, int raw) {
    if (raw >= 0 && raw != F_Q8_0) {    /* the nibble formats' constants: their loops built for them (Q8_0's
                                          * measured slower so) */
        z = zero_point(raw);
        mins = raw == F_Q4_1 || raw == F_Q5_1;
        sgn = 0;
    }
    __m256 lanes = _mm256_setzero_ps();
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int64_t full = nb & ~(int64_t)7;
    for (int64_t b = 0; b < full; b += 8)
        lanes = _mm256_add_ps(lanes, group_b32(w, b, 8, iota, z, sgn, mins, q, dx, s32, raw));
    if (full < nb)
        lanes = _mm256_add_ps(lanes, group_b32(w, full, (int)(nb - full), iota, z, sgn, mins, q, dx, s32, raw));
    return fold8_lanes(lanes);
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
/* rows i0 .. i1 - 1 of a 32-column-block matrix (Q4_0 .. Q8_0) against one activation row, from
 * their bytes, the loop inside the format's instance (one activation row: decoding the row into
 * bytes first cost about as much as its dot) */
static inline __attribute__((always_inline)) void rows_b32_span_at(const Mat *m, int64_t i0, int64_t i1, const Acts *a,
                                                                   const int f) {
    Row o;
    o.fmt = f;
    o.block_bytes = BLOCK_BYTES[f];
    for (int64_t i = i0; i < i1; i++) {
        o.raw = m->w + (m->order ? m->order[i] : i) * m->row_bytes;
        m->y[i] = row_b32_at(&o, m->cols / 32, zero_point(f), f == F_Q8_0, has_mins(f), a->q, a->d, a->s32, f);
    }
}

static void rows_b32_span(const Mat *m, int64_t i0, int64_t i1, const Acts *a) {
    switch (m->fmt) {
    case F_Q4_0: rows_b32_span_at(m, i0, i1, a, F_Q4_0); return;
    case F_Q4_1: rows_b32_span_at(m, i0, i1, a, F_Q4_1); return;
    case F_Q5_0: rows_b32_span_at(m, i0, i1, a, F_Q5_0); return;
    case F_Q5_1: rows_b32_span_at(m, i0, i1, a, F_Q5_1); return;
    default:     rows_b32_span_at(m, i0, i1, a, F_Q8_0); return;
    }
}

/* blocks b .. b + cnt - 1 of a row against n activation rows (2 to 8): the blocks' values and float
 * scales made once, in registers, then met by every row; each row's float part is group_b32's and
 * lands in its own lanes. With AVX2's 16 registers the held values spill, yet on an AVX2-only
 * core this beat decoding each row into bytes and reading them back per activation row, at real
 * widths and at SmolLM2's (docs/performance.md) */
static inline __attribute__((always_inline)) void group_b32_rows(const uint8_t *raw, int64_t b, const int cnt,
                                                                 __m256i iota, const Acts *a, int64_t n, int64_t nb,
                                                                 __m256 *lanes, const int f) {
    const int bb = BLOCK_BYTES[f], z = zero_point(f), sgn = f == F_Q8_0, mins = has_mins(f);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), iota);
    prefetch_ahead(raw + (int64_t)bb * b, 8 * bb);
    __m256i v[8];
    for (int k = 0; k < 8; k++) v[k] = k < cnt ? values32(f, raw + (int64_t)bb * (b + k)) : _mm256_setzero_si256();
    __m256 dw, mw;
    scales_b32(raw + (int64_t)bb * b, bb, cnt, &dw, &mw);
    for (int64_t r = 0; r < n; r++) {
        const int8_t *q = a->q + r * 32 * nb + 32 * b;
        I8 p[8];
        for (int k = 0; k < 8; k++)
            p[k] = k >= cnt ? _mm256_setzero_si256() : sgn ? dot32_sr(v[k], q + 32 * k) : dot32_ur(v[k], q + 32 * k);
        lanes[r] = _mm256_add_ps(lanes[r], floats_b32(p, dw, mw, a->s32 + r * nb + b, a->d + r * nb + b, m, z, mins));
    }
}

/* rows i0 .. i1 - 1 of a 32-column-block matrix (Q4_0 .. Q8_0) against 2 to 8 activation rows, from
 * their bytes: a group's blocks decoded once into registers for all the rows (a row decoded into
 * bytes and read back once an activation row cost a third more at SmolLM2's widths); every output
 * the bits row_b32_at gives it */
static inline __attribute__((always_inline)) void rows_b32_rows_span_at(const Mat *m, int64_t i0, int64_t i1,
                                                                        const Acts *a, int64_t n, const int f) {
    const int64_t nb = m->cols / 32, full = nb & ~(int64_t)7;
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t i = i0; i < i1; i++) {
        const uint8_t *raw = m->w + (m->order ? m->order[i] : i) * m->row_bytes;
        __m256 lanes[TILE];
        for (int64_t r = 0; r < n; r++) lanes[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < full; b += 8) group_b32_rows(raw, b, 8, iota, a, n, nb, lanes, f);
        if (full < nb) group_b32_rows(raw, full, (int)(nb - full), iota, a, n, nb, lanes, f);
        for (int64_t r = 0; r < n; r++) m->y[r * m->y_stride + i] = fold8_lanes(lanes[r]);
    }
}

static void rows_b32_rows_span(const Mat *m, int64_t i0, int64_t i1, const Acts *a, int64_t n) {
    switch (m->fmt) {
    case F_Q4_0: rows_b32_rows_span_at(m, i0, i1, a, n, F_Q4_0); return;
    case F_Q4_1: rows_b32_rows_span_at(m, i0, i1, a, n, F_Q4_1); return;
    case F_Q5_0: rows_b32_rows_span_at(m, i0, i1, a, n, F_Q5_0); return;
    case F_Q5_1: rows_b32_rows_span_at(m, i0, i1, a, n, F_Q5_1); return;
    default:     rows_b32_rows_span_at(m, i0, i1, a, n, F_Q8_0); return;
    }
}

/* the same against more activation rows (int8 and int4-g64: any number): each row decoded once
 * (decode_row) and met by every activation row, the format's zero point, sign and mins constants
 * of the instance (rows inner measured slower: a row's 32-byte blocks are cheap to load again,
 * the scratch is not) */
static inline __attribute__((always_inline)) void rows_b32_n_span_at(const Mat *m, int64_t i0, int64_t i1, const Acts *a,
                                                                     int64_t n, Row *o, const int f) {
    const int64_t cols = m->cols, nb = cols / 32;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t src = m->order ? m->order[i] : i;
        decode_row(f, m->w + src * m->row_bytes, m->scales ? m->scales + src * m->scale_stride : 0, cols, o);
        for (int64_t r = 0; r < n; r++)
            m->y[r * m->y_stride + i] = row_b32_at(o, nb, zero_point(f), f == F_Q8_0 || f == F_INT8, has_mins(f),
                                                   a->q + r * cols, a->d + r * nb, a->s32 + r * (cols / 32), -1);
    }
}

static void rows_b32_n_span(const Mat *m, int64_t i0, int64_t i1, const Acts *a, int64_t n, Row *o) {
    switch (m->fmt) {
    case F_Q4_0: rows_b32_n_span_at(m, i0, i1, a, n, o, F_Q4_0); return;
    case F_Q4_1: rows_b32_n_span_at(m, i0, i1, a, n, o, F_Q4_1); return;
    case F_Q5_0: rows_b32_n_span_at(m, i0, i1, a, n, o, F_Q5_0); return;
    case F_Q5_1: rows_b32_n_span_at(m, i0, i1, a, n, o, F_Q5_1); return;
    case F_Q8_0: rows_b32_n_span_at(m, i0, i1, a, n, o, F_Q8_0); return;
    case F_INT8: rows_b32_n_span_at(m, i0, i1, a, n, o, F_INT8); return;
    default:     rows_b32_n_span_at(m, i0, i1, a, n, o, F_INT4G64); return;
    }
}
#endif
