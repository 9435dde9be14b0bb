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
 * one superblock at a time for every activation row of the call (rows_k_span, in
 * qdot_rows_k.h; rows of fewer than 8 superblocks, an expert's down, several
 * to a group of 8: rows_k_short), and a 32-column-block row the same way
 * when one row is fed (rows_b32_span, in qdot_rows_b32.h); 2 to 8 rows meet
 * a group of its blocks held in registers on AVX-512 (rows_b32_rows_span);
 * otherwise such a row is decoded once into bytes (decode_row) and
 * shared. A thread takes a chunk of weight rows a
 * call (the *_span functions: the row loop inside each format's instance,
 * whose per-row setup was a third of a 2048-column row's time).
 * Many activation rows (a prompt's block) take gemm (qdot_gemm.h):
 * tiles whose vector lanes are activation rows, so that nothing is summed
 * across lanes. Plain C decodes every row. Each row's bits stay its own.
 *
 * The library also holds attention's scores for heads wider than 64 columns
 * (vk_scores, attend_scores.h), a float kernel numba's code calls as it calls
 * these (jit_qdot), and the float weights' rows against float32 activations (vk_float_rows,
 * float_dot.h), which jit_blocks' GEMV calls the same way.
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


#if defined(__AVX2__)
/* one block of quantize_q8, eight lanes at a time (fb a multiple of 32): the same operations on
 * each value as the scalar loop below; the block's largest magnitude is the same in any order,
 * and a block with an infinity or NaN gives NaN and zeros whatever its maximum */
static float quantize_block(const float *xb, int64_t fb, int8_t *qb) {
    const float inv_max = (float)(1.0 / 127.0), min_normal = 1.17549435e-38f;
    const __m256i expo = _mm256_set1_epi32(0x7F800000), sign = _mm256_set1_epi32(0x7FFFFFFF);
    __m256 amax = _mm256_setzero_ps();
    __m256i bad = _mm256_setzero_si256();
    for (int64_t i = 0; i < fb; i += 8) {
        const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(xb + i));
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(u, expo), expo));
        amax = _mm256_max_ps(amax, _mm256_castsi256_ps(_mm256_and_si256(u, sign)));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float db = _mm_cvtss_f32(m4) * inv_max;
    const int isbad = !_mm256_testz_si256(bad, bad), ok = !isbad && db >= min_normal;
    if (!ok) {
        memset(qb, 0, (size_t)fb);
        return isbad ? from_bits(0x7FC00000u) : 0.0f;
    }
    const __m256 inv = _mm256_set1_ps(recip(db)), magic = _mm256_set1_ps(12582912.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < fb; i += 32) {
        __m256i v[4];
        for (int k = 0; k < 4; k++) {
            __m256 t = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * k), inv), magic), magic);
            v[k] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(t, lo), hi));     /* integral: exact */
        }
        const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256((__m256i *)(qb + i), _mm256_permutevar8x32_epi32(b, order));
    }
    return db;
}
#endif

void vk_q8_quantize(const float *x, int64_t n, int64_t cols, int64_t fb,
                    int8_t *q, float *d, int16_t *s16, int32_t *s32) {
    const float inv_max = (float)(1.0 / 127.0), magic = 12582912.0f, min_normal = 1.17549435e-38f;
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * cols;
        int8_t *qr = q + r * cols;
        for (int64_t b = 0; b < cols / fb; b++) {
            const float *xb = xr + b * fb;
#if defined(__AVX2__)
            if (fb % 32 == 0) {
                d[r * (cols / fb) + b] = quantize_block(xb, fb, qr + b * fb);
                continue;
            }
#endif
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
/* fold8 of a register's lanes, by shuffles: the same sums in the same order */
static inline float fold8_lanes(__m256 l) {
    const __m128 a = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));    /* a_k = l_k + l_k+4 */
    const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));                                    /* a0 + a2, a1 + a3 */
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
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

enum { TILE = 8, RB = 32 };   /* activation rows (16 KB of 2048 columns), weight rows a block */

#include "qdot_rows_b32.h"
#include "qdot_rows_k.h"

/* rows a group of rows_k_short takes from this matrix (0: row by row): K-quant rows of fewer than
 * 8 superblocks stored one after another */
static int short_group(const Mat *m) {
#if defined(__AVX2__)
    const int64_t nb = m->cols / 256;
    if (m->fmt < F_Q2_K || m->order || nb < 1 || nb >= 8 || m->row_bytes != nb * BLOCK_BYTES[m->fmt]) return 0;
    return (int)(8 / nb);
#else
    (void)m;
    return 0;
#endif
}

#include "qdot_gemm.h"

#if !defined(__AVX2__)
/* plain C: one weight row decoded into bytes (decode_row), then every activation row against it */
static void one_row(const Mat *m, int64_t i, const Acts *a, int64_t n, Row *o) {
    const int f = m->fmt, kq = f >= F_Q2_K, fb = kq ? 256 : 32, z = zero_point(f);
    const int sgn = f == F_Q8_0 || f == F_INT8;
    const int mins = has_mins(f);
    const int64_t cols = m->cols, nb = cols / fb, src = m->order ? m->order[i] : i;
    o->raw = m->w + src * m->row_bytes;
    o->fmt = f;
    o->block_bytes = BLOCK_BYTES[f];
    decode_row(f, o->raw, m->scales ? m->scales + src * m->scale_stride : 0, cols, o);
    for (int64_t r = 0; r < n; r++)
        m->y[r * m->y_stride + i] = kq ? row_k(o, nb, z, mins, a->q + r * cols, a->d + r * nb, a->s16 + r * (cols / 16))
                                       : row_b32(o, nb, z, sgn, mins, a->q + r * cols, a->d + r * nb, a->s32 + r * (cols / 32));
}
#endif

/* An input of a call: n rows of cols float32, quantised once per block size its matrices need
 * (vector builds, for the matrices gemm takes: also as its tiles, t[0] 32-column blocks, t[1]
 * K-quant superblocks). */
typedef struct {
    const float *x;
    int64_t n, cols;
    Acts a[2];
#if defined(__AVX2__)
    Tiles t[2];
#endif
} Input;

/* whether gemm takes a matrix of format f for n rows (else the row kernels) */
static inline int gemm_rows(int f, int64_t n) {
#if defined(__AVX2__)
    return gemm_takes(f, n);
#else
    (void)f; (void)n;
    return 0;
#endif
}

/* need[kq]: a matrix reads the input in blocks of 32 columns (0) or 256 (1); need[2 + kq]: gemm
 * takes one of them */
static int quantize_input(Input *in, const int need[4]) {
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
#if defined(__AVX2__)
        if (need[2 + kq] && tiles_build(&in->t[kq], a, n, cols, fb)) return -1;
#endif
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
        int need[4] = {0, 0, 0, 0};
        for (int k = 0; k < count; k++)
            if (at[k] == i) {
                need[mats[k].fmt >= F_Q2_K] = 1;
                need[2 + (mats[k].fmt >= F_Q2_K)] |= gemm_rows(mats[k].fmt, ins[i].n);
            }
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
    size_t gk = 0;              /* gemm's unpacked weight group and its lanes */
#if defined(__AVX2__)
    for (int k = 0; k < count && !gk; k++)
        if (gemm_rows(mats[k].fmt, ins[at[k]].n)) gk = unpacked_bytes(cols);
#endif
    const size_t per = (su + 2 * sf + 2 * s8 + sp + sl + gk + 4095) / 4096 * 4096 + 4096;
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
        float *L = (float *)p; p += sl;
#if defined(__AVX2__)
        Unpacked ug;
        float *gl = 0;
        if (gk) unpacked_carve(p, cols, &ug, &gl);
#endif
        for (int k = 0; k < count && !failed; k++) {
            const Mat *m = &mats[k];
            const Input *in = &ins[at[k]];
            /* one run of rows a thread a matrix (up to 4096 rows, so that a vocabulary's rows still
             * balance): the hardware prefetchers follow one stream a thread, and each new stream
             * starts cold (8-row chunks handed out in turn read at half the bandwidth; a quarter of
             * a matrix a chunk cost a MoE expert's 768 rows a tenth of their rate) */
            int64_t chunk = m->rows / threads;
            chunk = chunk < 8 ? 8 : chunk > 4096 ? 4096 : chunk;
#if defined(__AVX2__)
            if (gemm_rows(m->fmt, in->n)) {
                const int64_t groups = (m->rows + GW - 1) / GW;
                #pragma omp for schedule(dynamic, 1) nowait
                for (int64_t gi = 0; gi < groups; gi++) gemm(m, gi, &in->t[m->fmt >= F_Q2_K], in->n, &ug, gl);
                continue;
            }
#endif
            const int g = short_group(m);
            if (g) {
#if defined(__AVX2__)
                const Acts *a = &in->a[1];
                const int64_t groups = (m->rows + g - 1) / g, per = (chunk + g - 1) / g, spans = (groups + per - 1) / per;
                #pragma omp for schedule(dynamic, 1) nowait
                for (int64_t c = 0; c < spans; c++)
                    rows_k_short(m->w, m->row_bytes, m->rows, c * per, (c + 1) * per < groups ? (c + 1) * per : groups,
                                 m->fmt, m->cols / 256, g, a->q, a->d, a->s16, in->n, m->cols, m->y, m->y_stride, (I8 *)P);
#endif
                continue;
            }
#if defined(__AVX2__)
            if (in->n <= TILE || m->fmt < F_Q2_K) {         /* dynamic(chunk)'s chunks, a call each */
                const int64_t spans = (m->rows + chunk - 1) / chunk;
                #pragma omp for schedule(dynamic, 1) nowait
                for (int64_t c = 0; c < spans; c++) {
                    const int64_t i0 = c * chunk, i1 = i0 + chunk < m->rows ? i0 + chunk : m->rows;
                    if (m->fmt >= F_Q2_K) rows_k_span(m, i0, i1, &in->a[1], in->n, P, L);
                    else if (m->fmt <= F_Q8_0 && in->n == 1) rows_b32_span(m, i0, i1, &in->a[0]);
                    else if (m->fmt <= F_Q8_0 && in->n <= TILE) rows_b32_rows_span(m, i0, i1, &in->a[0], in->n);
                    else rows_b32_n_span(m, i0, i1, &in->a[0], in->n, &o);
                }
                continue;
            }
            /* K-quant rows against more activation rows than fit L1: RB weight rows (which stay in
             * L2) against TILE activation rows at a time (which stay in L1); each output is the
             * same one row's dot, so the bits do not change */
            const Acts *a = &in->a[1];
            const int64_t blocks = (m->rows + RB - 1) / RB, nb = m->cols / 256;
            #pragma omp for schedule(dynamic, (chunk + RB - 1) / RB) nowait
            for (int64_t bi = 0; bi < blocks; bi++) {
                const int64_t i0 = bi * RB, i1 = i0 + RB < m->rows ? i0 + RB : m->rows;
                for (int64_t t0 = 0; t0 < in->n; t0 += TILE) {
                    const int64_t tn = in->n - t0 < TILE ? in->n - t0 : TILE;
                    const Acts at = {a->q + t0 * m->cols, a->d + t0 * nb, a->s16 + t0 * (m->cols / 16),
                                     a->s32 + t0 * (m->cols / 32)};
                    Mat mt = *m;
                    mt.y = m->y + t0 * m->y_stride;
                    rows_k_span(&mt, i0, i1, &at, tn, P, L);
                }
            }
#else
            (void)P; (void)L;
            #pragma omp for schedule(dynamic, chunk) nowait
            for (int64_t i = 0; i < m->rows; i++) one_row(m, i, &in->a[m->fmt >= F_Q2_K], in->n, &o);
#endif
        }
    }
    free(scratch);
    for (int i = 0; i < nin; i++)
        for (int kq = 0; kq < 2; kq++) {
            free(ins[i].a[kq].q); free(ins[i].a[kq].d); free(ins[i].a[kq].s16); free(ins[i].a[kq].s32);
#if defined(__AVX2__)
            tiles_free(&ins[i].t[kq]);
#endif
        }
    return failed ? -1 : 0;
}

/* The matrices one input x (n rows of cols float32) feeds, in one call. */
int vk_q8_gemvs(const Mat *mats, int count, const float *x, int64_t n, int threads) {
    if (count <= 0 || n <= 0) return 0;
    Input in;
    memset(&in, 0, sizeof in);
    in.x = x; in.n = n; in.cols = mats[0].cols;
    int *at = calloc((size_t)count, sizeof(int));
    const int r = at ? run(mats, count, &in, 1, at, threads) : -1;
    free(at);
    return r;
}

/* Matrix k against its own input xs[k] (ns[k] rows of its cols), in one call: a MoE layer's
 * expert downs, each fed by its own expert, or its gates and ups, each fed by its rows. Matrices
 * given the same input (pointer, rows, cols) share its quantisation; it is done once per input. */
int vk_q8_gemvs_each(const Mat *mats, int count, const float *const *xs, const int64_t *ns, int threads) {
    if (count <= 0) return 0;
    Input *ins = calloc((size_t)count, sizeof(Input));
    int *at = calloc((size_t)count, sizeof(int));
    int r = -1, nin = 0;
    if (ins && at) {
        for (int k = 0; k < count; k++) {
            int i = nin;
            if (nin && ins[nin - 1].x == xs[k] && ins[nin - 1].n == ns[k] && ins[nin - 1].cols == mats[k].cols)
                i = nin - 1;                       /* the previous matrix's input: a gate's, for its up */
            if (i == nin) { ins[nin].x = xs[k]; ins[nin].n = ns[k]; ins[nin].cols = mats[k].cols; nin++; }
            at[k] = i;
        }
        r = run(mats, count, ins, nin, at, threads);
    }
    free(ins);
    free(at);
    return r;
}

#include "attend_scores.h"
#include "float_dot.h"
