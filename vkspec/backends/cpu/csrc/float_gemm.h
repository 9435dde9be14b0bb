/* Float weights against many activation rows (float_dot.h includes this before vk_float_rows, which
 * sends a call here when it has at least FG_MIN activation rows): the same sums as fl_rows, in the
 * same order in every lane, computed as GEMM tiles.
 *
 * Why: fl_rows keeps all 128 lanes of a dot in registers, so at most two activation rows share a
 * widened weight step and every product costs about one load; a prefill of a few hundred rows was
 * bound by those loads. Each lane of exact.dot adds its own column's products in step order, and
 * the lanes do not meet until the fold, so one register's lanes (a lane group) can be summed over
 * many steps before the next group starts, and put aside and taken on again later. A tile of FG_R
 * activation rows by FG_C weight rows then holds FG_R * FG_C accumulators of one lane group, and
 * FG_R + FG_C loads feed 2 * FG_R * FG_C operations. The lane sums wait in a buffer between runs
 * of FG_K steps, and each dot is folded there as fl_rows folds it.
 *
 * A tile past the last activation or weight row repeats that row and drops the outputs, so one
 * tile shape serves every call. The AVX2 shapes were chosen by timing on a Zen 3 core; the AVX-512
 * ones (twice the registers) were not timed. */

enum { FG_MIN = 9 };                     /* up to 8 rows stay with fl_rows: one weight stream, one tile */
enum { FG_ROWS = 16 };                   /* weight rows whose lane sums wait in acc (jit_blocks' BLOCK) */

#if defined(__AVX512F__)
enum { FG_R = 4, FG_C = 4, FG_LANES = 16, FG_K = 4 };
typedef __m512 fg_vec;
#define FG_ZERO() _mm512_setzero_ps()
#define FG_LOAD(p) _mm512_loadu_ps(p)
#define FG_STORE(p, v) _mm512_storeu_ps(p, v)
#define FG_ADD(a, b) _mm512_add_ps(a, b)
#define FG_MUL(a, b) _mm512_mul_ps(a, b)
#define FG_WIDEN(fmt, p) fl_widen16(fmt, p)
static inline float fg_fold(const float *a) {
    __m512 v[8];
    for (int z = 0; z < 8; z++) v[z] = _mm512_loadu_ps(a + 16 * z);
    return fl_fold(v);
}
#elif defined(__AVX2__)
enum { FG_R = 2, FG_C = 4, FG_LANES = 8, FG_K = 4 };
typedef __m256 fg_vec;
#define FG_ZERO() _mm256_setzero_ps()
#define FG_LOAD(p) _mm256_loadu_ps(p)
#define FG_STORE(p, v) _mm256_storeu_ps(p, v)
#define FG_ADD(a, b) _mm256_add_ps(a, b)
#define FG_MUL(a, b) _mm256_mul_ps(a, b)
#define FG_WIDEN(fmt, p) fl_widen8(fmt, p)
static inline float fg_fold(const float *a) {
    __m256 Q[16];
    for (int g = 0; g < 16; g++) {
        const __m256 v = _mm256_loadu_ps(a + 8 * g);
        const __m256 p = _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));
        Q[g] = _mm256_add_ps(p, _mm256_permute_ps(p, 0x4E));
    }
    return fl_fold_q(Q);
}
#endif

#if defined(__AVX512F__) || defined(__AVX2__)
/* one tile over steps c0 <= c < c1 (the tail too, where t): acc[i][r][128] holds the 128 lane sums of
 * dot(x row r, weight row i) so far, and takes them on (from +0 where c0 == 0) */
static inline __attribute__((always_inline)) void fg_tile(const int fmt, const uint8_t *const *w,
                                                          const float *const *wt, const float *const *x,
                                                          const float *const *xt, int64_t c0, int64_t c1, int t,
                                                          float (*acc)[FG_R][128]) {
    const int es = fmt == FL_F32 ? 4 : 2;
    for (int g = 0; g < 128; g += FG_LANES) {
        fg_vec a[FG_R][FG_C];
        for (int r = 0; r < FG_R; r++)
            for (int i = 0; i < FG_C; i++) a[r][i] = c0 ? FG_LOAD(acc[i][r] + g) : FG_ZERO();
        for (int64_t c = c0; c < c1; c++) {
            fg_vec W[FG_C];
            for (int i = 0; i < FG_C; i++) W[i] = FG_WIDEN(fmt, w[i] + (128 * c + g) * es);
            for (int r = 0; r < FG_R; r++) {
                const fg_vec v = FG_LOAD(x[r] + 128 * c + g);
                for (int i = 0; i < FG_C; i++) a[r][i] = FG_ADD(a[r][i], FG_MUL(v, W[i]));
            }
        }
        if (t)
            for (int r = 0; r < FG_R; r++)
                for (int i = 0; i < FG_C; i++)
                    a[r][i] = FG_ADD(a[r][i], FG_MUL(FG_LOAD(xt[r] + g), FG_LOAD(wt[i] + g)));
        for (int r = 0; r < FG_R; r++)
            for (int i = 0; i < FG_C; i++) FG_STORE(acc[i][r] + g, a[r][i]);
    }
}

/* fl_span's outputs for n >= FG_MIN activation rows, FG_ROWS weight rows at a time. Within them,
 * for each tile of FG_R activation rows, FG_K steps at a time: those columns of the tile's rows
 * stay in L1 while every weight row's same columns pass by (the lane sums wait in acc between) */
static inline __attribute__((always_inline)) void fg_span(const int fmt, const uint8_t *w, int64_t row_bytes,
                                                          int64_t rows, const float *x, int64_t n, int64_t cols,
                                                          float *y, int64_t ys) {
    const int64_t steps = cols / 128, rest = cols % 128;
    float xt[FG_R][128], wt[FG_ROWS][128], acc[FG_ROWS + FG_C - 1][FG_R][128];   /* a last tile's spare rows too */
    for (int64_t b = 0; b < rows; b += FG_ROWS) {
        const int64_t nb = rows - b < FG_ROWS ? rows - b : FG_ROWS;
        for (int64_t i = 0; rest && i < nb; i++) fl_tail(fmt, w + (b + i) * row_bytes, 128 * steps, cols, wt[i]);
        for (int64_t r0 = 0; r0 < n; r0 += FG_R) {
            const float *xr[FG_R], *xtr[FG_R];
            for (int r = 0; r < FG_R; r++) {
                const int64_t at = r0 + r < n ? r0 + r : n - 1;
                xr[r] = x + at * cols;
                xtr[r] = xt[r];
                if (rest) fl_tail(FL_F32, (const uint8_t *)xr[r], 128 * steps, cols, xt[r]);
            }
            for (int64_t c0 = 0; c0 < steps || (c0 == 0 && rest); c0 += FG_K) {
                const int64_t c1 = steps - c0 < FG_K ? steps : c0 + FG_K;
                for (int64_t i0 = 0; i0 < nb; i0 += FG_C) {
                    const uint8_t *wr[FG_C];
                    const float *wtr[FG_C];
                    for (int i = 0; i < FG_C; i++) {
                        const int64_t at = i0 + i < nb ? i0 + i : nb - 1;
                        wr[i] = w + (b + at) * row_bytes;
                        wtr[i] = wt[at];
                    }
                    fg_tile(fmt, wr, wtr, xr, xtr, c0, c1, rest && c1 == steps, acc + i0);
                }
            }
            for (int r = 0; r < FG_R && r0 + r < n; r++)
                for (int i = 0; i < nb; i++) y[(r0 + r) * ys + b + i] = fg_fold(acc[i][r]);
        }
    }
}
#endif
