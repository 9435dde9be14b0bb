/* Float weights (f32, f16, bf16) against float32 activation rows, in exact.dot's order (included by
 * qdot.c, after its kernels): y[r * ys + i] = dot(x[r], values of weight row i), lane j of 128
 * accumulating +0, then + x[128 c + j] * w[128 c + j] for c ascending (one rounded product, one
 * rounded add: built with -ffp-contract=off); the lanes folded as exact._finish folds them,
 * (a[4l] + a[4l+1]) + (a[4l+2] + a[4l+3]) per lane l of 32, then l += l + h for h = 16 .. 1.
 * A last partial step of 128 columns reads the definition's zero padding from buffers.
 *
 * Why: jit_blocks decoded such a row one scalar at a time into a buffer before dotting it, which
 * held an f16 file's decode to a fifth of the speed of its bytes. Here the values are widened in
 * registers as they are read (vcvtph2ps; bf16 is its bits shifted; both exact), so a row streams
 * once from memory, and up to two activation rows (AVX-512) share each widened vector.
 *
 * Float adds and products are commutative bit for bit (NaN payloads are outside the contract), so
 * the folds may take a sum's operands in either order. */

enum { FL_F32, FL_F16, FL_BF16 };       /* jit_blocks' codes for these formats */
enum { FL_TILE = 8 };                    /* activation rows a pass over the call's weight rows */

static inline float fl_value(const int fmt, const uint8_t *row, int64_t j) {
    if (fmt == FL_F16) return f16(row + 2 * j);
    if (fmt == FL_BF16) return from_bits((uint32_t)(row[2 * j] | (row[2 * j + 1] << 8)) << 16);
    float v;
    memcpy(&v, row + 4 * j, 4);
    return v;
}

/* a row's last partial step (a weight row, or an activation row as FL_F32) in t[0..127], +0 past cols */
static inline void fl_tail(const int fmt, const uint8_t *row, int64_t at, int64_t cols, float *t) {
    for (int64_t j = 0; j < 128; j++) t[j] = at + j < cols ? fl_value(fmt, row, at + j) : 0.0f;
}

#if defined(__AVX512F__)
static inline __m512 fl_widen16(const int fmt, const uint8_t *p) {
    if (fmt == FL_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    if (fmt == FL_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    return _mm512_loadu_ps((const float *)p);
}

/* exact._finish of 128 lanes, a[z] holding lanes 16 z .. 16 z + 15 (attend_scores.h's tree) */
static inline float fl_fold(const __m512 *a) {
    __m512 S[8];
    for (int z = 0; z < 8; z++) {
        const __m512 p = _mm512_add_ps(a[z], _mm512_permute_ps(a[z], 0xB1));   /* a0 + a1, a2 + a3 */
        S[z] = _mm512_add_ps(p, _mm512_permute_ps(p, 0x4E));                 /* lane 4 z + L in 128-bit lane L */
    }
    for (int z = 0; z < 4; z++) S[z] = _mm512_add_ps(S[z], S[z + 4]);       /* h = 16 */
    for (int z = 0; z < 2; z++) S[z] = _mm512_add_ps(S[z], S[z + 2]);       /* h = 8 */
    __m512 v = _mm512_add_ps(S[0], S[1]);                                   /* h = 4 */
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));     /* h = 2 */
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));     /* h = 1 */
    return _mm512_cvtss_f32(v);
}

/* R (1 or 2) activation rows against one weight row: each step's 128 values widened once */
static inline __attribute__((always_inline)) void fl_rows(const int fmt, const int R, const uint8_t *row,
                                                          int64_t steps, const float *wt, const float *const *xr,
                                                          const float *const *xt, float *const *out) {
    const int es = fmt == FL_F32 ? 4 : 2;
    __m512 a[2][8];
    for (int r = 0; r < R; r++)
        for (int z = 0; z < 8; z++) a[r][z] = _mm512_setzero_ps();
    for (int64_t c = 0; c < steps; c++) {
        __m512 W[8];
        for (int z = 0; z < 8; z++) W[z] = fl_widen16(fmt, row + (128 * c + 16 * z) * es);
        for (int r = 0; r < R; r++)
            for (int z = 0; z < 8; z++)
                a[r][z] = _mm512_add_ps(a[r][z], _mm512_mul_ps(_mm512_loadu_ps(xr[r] + 128 * c + 16 * z), W[z]));
    }
    if (wt)
        for (int r = 0; r < R; r++)
            for (int z = 0; z < 8; z++)
                a[r][z] = _mm512_add_ps(a[r][z],
                                        _mm512_mul_ps(_mm512_loadu_ps(xt[r] + 16 * z), _mm512_loadu_ps(wt + 16 * z)));
    for (int r = 0; r < R; r++) *out[r] = fl_fold(a[r]);
}

#elif defined(__AVX2__)
static inline __m256 fl_widen8(const int fmt, const uint8_t *p) {
    if (fmt == FL_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    if (fmt == FL_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    return _mm256_loadu_ps((const float *)p);
}

/* exact._finish's tree from its first level: Q[g] holds lanes 2 g and 2 g + 1 at 0 and 4 */
static inline float fl_fold_q(__m256 *Q) {
    for (int h = 8; h >= 1; h /= 2)                                         /* h = 16, 8, 4, 2 */
        for (int g = 0; g < h; g++) Q[g] = _mm256_add_ps(Q[g], Q[g + h]);
    const __m256 v = _mm256_add_ps(Q[0], _mm256_permute2f128_ps(Q[0], Q[0], 1));   /* h = 1 */
    return _mm256_cvtss_f32(v);
}

/* one activation row (R = 1): all 128 lanes in one pass over the row, a register g of the 16
 * holding lanes 8 g .. 8 g + 7. With their operands they need more than the 16 ymm registers, and
 * the compiler keeps a few of them in L1 between steps: two passes of 64 lanes, each reading half
 * of every step's cache lines, read a wide row from memory more slowly (docs/performance.md). The
 * row is prefetched ahead (builds without AVX-512, as PREFETCH_ONE), also when it is met again by
 * the next activation row: measured faster at 1, 2 and 4 rows */
static inline __attribute__((always_inline)) void fl_rows(const int fmt, const int R, const uint8_t *row,
                                                          int64_t steps, const float *wt, const float *const *xr,
                                                          const float *const *xt, float *const *out) {
    (void)R;
    const int es = fmt == FL_F32 ? 4 : 2;
    __m256 a[16], Q[16];
    for (int z = 0; z < 16; z++) a[z] = _mm256_setzero_ps();
    for (int64_t c = 0; c < steps; c++) {
        prefetch_ahead(row + 128 * c * es, 128 * es);           /* PREFETCH_ONE's reason */
        for (int z = 0; z < 16; z++)
            a[z] = _mm256_add_ps(a[z], _mm256_mul_ps(_mm256_loadu_ps(xr[0] + 128 * c + 8 * z),
                                                      fl_widen8(fmt, row + (128 * c + 8 * z) * es)));
    }
    if (wt)
        for (int z = 0; z < 16; z++)
            a[z] = _mm256_add_ps(a[z], _mm256_mul_ps(_mm256_loadu_ps(xt[0] + 8 * z), _mm256_loadu_ps(wt + 8 * z)));
    for (int z = 0; z < 16; z++) {
        const __m256 p = _mm256_add_ps(a[z], _mm256_permute_ps(a[z], 0xB1));
        Q[z] = _mm256_add_ps(p, _mm256_permute_ps(p, 0x4E));       /* lanes 2 g, 2 g + 1 at 0, 4 */
    }
    *out[0] = fl_fold_q(Q);
}

#else
static inline void fl_rows(const int fmt, const int R, const uint8_t *row, int64_t steps, const float *wt,
                           const float *const *xr, const float *const *xt, float *const *out) {
    (void)R;
    float a[128];
    for (int j = 0; j < 128; j++) a[j] = 0.0f;
    for (int64_t c = 0; c <= steps; c++) {
        if (c == steps && !wt) break;
        const float *x = c < steps ? xr[0] + 128 * c : xt[0];
        for (int j = 0; j < 128; j++) a[j] = a[j] + x[j] * (c < steps ? fl_value(fmt, row, 128 * c + j) : wt[j]);
    }
    float l[32];
    for (int k = 0; k < 32; k++) l[k] = (a[4 * k] + a[4 * k + 1]) + (a[4 * k + 2] + a[4 * k + 3]);
    for (int h = 16; h >= 1; h /= 2)
        for (int k = 0; k < h; k++) l[k] = l[k] + l[k + h];
    *out[0] = l[0];
}
#endif

#if defined(__AVX512F__)
enum { FL_R = 2 };                       /* activation rows sharing a widened step */
#else
enum { FL_R = 1 };
#endif

static inline __attribute__((always_inline)) void fl_span(const int fmt, const uint8_t *w, int64_t row_bytes,
                                                          int64_t rows, const float *x, int64_t n, int64_t cols,
                                                          float *y, int64_t ys) {
    const int64_t steps = cols / 128, rest = cols % 128;
    float xt[FL_TILE][128], wt[128];
    for (int64_t t0 = 0; t0 < n; t0 += FL_TILE) {
        const int64_t tn = n - t0 < FL_TILE ? n - t0 : FL_TILE;
        if (rest)
            for (int64_t r = 0; r < tn; r++)
                fl_tail(FL_F32, (const uint8_t *)(x + (t0 + r) * cols), 128 * steps, cols, xt[r]);
        for (int64_t i = 0; i < rows; i++) {
            const uint8_t *row = w + i * row_bytes;
            if (rest) fl_tail(fmt, row, 128 * steps, cols, wt);
            int64_t r = 0;
            for (; FL_R == 2 && r + 2 <= tn; r += 2) {
                const float *xr[2] = {x + (t0 + r) * cols, x + (t0 + r + 1) * cols}, *xtr[2] = {xt[r], xt[r + 1]};
                float *out[2] = {y + (t0 + r) * ys + i, y + (t0 + r + 1) * ys + i};
                fl_rows(fmt, 2, row, steps, rest ? wt : 0, xr, xtr, out);
            }
            for (; r < tn; r++) {
                const float *xr[1] = {x + (t0 + r) * cols}, *xtr[1] = {xt[r]};
                float *out[1] = {y + (t0 + r) * ys + i};
                fl_rows(fmt, 1, row, steps, rest ? wt : 0, xr, xtr, out);
            }
        }
    }
}

#include "float_gemm.h"

/* y[r * ys + i] = dot(x[r], the values of row i) for the weight rows i < rows (row_bytes apart,
 * in format fmt: FL_F32, FL_F16 or FL_BF16) and the activation rows r < n (cols float32 apart);
 * one thread's work: callers share the rows out. */
void vk_float_rows(int fmt, const uint8_t *w, int64_t row_bytes, int64_t rows, const float *x, int64_t n,
                   int64_t cols, float *y, int64_t ys) {
#if defined(__AVX512F__) || defined(__AVX2__)
    if (n >= FG_MIN && cols > 0) {
        if (fmt == FL_F16) fg_span(FL_F16, w, row_bytes, rows, x, n, cols, y, ys);
        else if (fmt == FL_BF16) fg_span(FL_BF16, w, row_bytes, rows, x, n, cols, y, ys);
        else fg_span(FL_F32, w, row_bytes, rows, x, n, cols, y, ys);
        return;
    }
#endif
    if (fmt == FL_F16) fl_span(FL_F16, w, row_bytes, rows, x, n, cols, y, ys);
    else if (fmt == FL_BF16) fl_span(FL_BF16, w, row_bytes, rows, x, n, cols, y, ys);
    else fl_span(FL_F32, w, row_bytes, rows, x, n, cols, y, ys);
}
