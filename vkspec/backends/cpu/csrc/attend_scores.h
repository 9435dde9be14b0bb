/* Attention scores of heads wider than 64 columns (included by qdot.c, after its kernels):
 * out[i * os + t] = dot(q_i[:d], k_t[:d]) * scale in exact.dot's order (its lane accumulators
 * acc[l][j] = +0 + q k over columns 128 c + 4 l + j, then (acc0 + acc1) + (acc2 + acc3) per lane
 * and the lane tree l += l + h for h = 16 .. 1), for the query rows i < nq at q + i * qs and the key
 * rows t < nkeys at k + t * ks; columns past d are the definition's +0 padding.
 *
 * Why: jit_dot.dot_rows scores a key at a time, its 128 lanes folded in a tree of their own, and
 * the queries-in-lanes kernel (jit_ir.query_scores_ir) takes heads of up to 64 columns. Here four
 * keys go together: a 128-bit lane of a register holds one lane l's four accumulators, so four
 * keys' registers transposed within their 128-bit lanes put lane l's (x + y) + (z + w) of the four
 * keys side by side, and the tree that follows adds whole registers, every key's in its own slot.
 * Float adds are commutative, so s_l + s_l+h in either operand order is the same bits. */

#if defined(__AVX512F__)
/* the four keys' sums, in exact.dot's order, into s[0..3]; steps of 128 columns, whole: d = 128 steps
 * (constants where inlined: a run-time count and masks made it twice as slow) */
static inline __attribute__((always_inline)) void scores4_at(const float *const *kr, const float *q, int64_t d, float *s,
                                                             const int steps, const int whole) {
    __m512 S[8];
#pragma GCC unroll 8
    for (int z = 0; z < 8; z++) {
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int c = 0; c < steps; c++) {
            const int64_t at = 128 * c + 16 * z;
            const __mmask16 m = whole || at + 16 <= d ? (__mmask16)0xFFFF : at >= d ? 0 : (__mmask16)((1u << (d - at)) - 1);
            const __m512 qv = whole ? _mm512_loadu_ps(q + at) : _mm512_maskz_loadu_ps(m, q + at);
            for (int j = 0; j < 4; j++)
                a[j] = _mm512_add_ps(a[j], _mm512_mul_ps(qv, whole ? _mm512_loadu_ps(kr[j] + at) : _mm512_maskz_loadu_ps(m, kr[j] + at)));
        }
        const __m512d t0 = _mm512_castps_pd(_mm512_unpacklo_ps(a[0], a[1])), t1 = _mm512_castps_pd(_mm512_unpackhi_ps(a[0], a[1]));
        const __m512d t2 = _mm512_castps_pd(_mm512_unpacklo_ps(a[2], a[3])), t3 = _mm512_castps_pd(_mm512_unpackhi_ps(a[2], a[3]));
        const __m512 x = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2)), y = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        const __m512 u = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3)), w = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
        S[z] = _mm512_add_ps(_mm512_add_ps(x, y), _mm512_add_ps(u, w));     /* lane 4 z + L in 128-bit lane L */
    }
    for (int z = 0; z < 4; z++) S[z] = _mm512_add_ps(S[z], S[z + 4]);       /* h = 16 */
    for (int z = 0; z < 2; z++) S[z] = _mm512_add_ps(S[z], S[z + 2]);       /* h = 8 */
    __m512 v = _mm512_add_ps(S[0], S[1]);                                   /* h = 4 */
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));     /* h = 2 */
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));     /* h = 1 */
    _mm_storeu_ps(s, _mm512_castps512_ps128(v));
}
#elif defined(__AVX2__)
static inline __attribute__((always_inline)) void scores4_at(const float *const *kr, const float *q, int64_t d, float *s,
                                                             const int steps, const int whole) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 S[16];
#pragma GCC unroll 16
    for (int z = 0; z < 16; z++) {
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int c = 0; c < steps; c++) {
            const int64_t at = 128 * c + 8 * z;
            const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(d - at < 8 ? (d - at < 0 ? 0 : d - at) : 8)), iota);
            const __m256 qv = whole ? _mm256_loadu_ps(q + at) : _mm256_maskload_ps(q + at, m);
            for (int j = 0; j < 4; j++)
                a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(qv, whole ? _mm256_loadu_ps(kr[j] + at) : _mm256_maskload_ps(kr[j] + at, m)));
        }
        const __m256d t0 = _mm256_castps_pd(_mm256_unpacklo_ps(a[0], a[1])), t1 = _mm256_castps_pd(_mm256_unpackhi_ps(a[0], a[1]));
        const __m256d t2 = _mm256_castps_pd(_mm256_unpacklo_ps(a[2], a[3])), t3 = _mm256_castps_pd(_mm256_unpackhi_ps(a[2], a[3]));
        const __m256 x = _mm256_castpd_ps(_mm256_unpacklo_pd(t0, t2)), y = _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t2));
        const __m256 u = _mm256_castpd_ps(_mm256_unpacklo_pd(t1, t3)), w = _mm256_castpd_ps(_mm256_unpackhi_pd(t1, t3));
        S[z] = _mm256_add_ps(_mm256_add_ps(x, y), _mm256_add_ps(u, w));     /* lane 2 z + L in 128-bit lane L */
    }
    for (int h = 8; h >= 1; h /= 2)                                         /* lane steps h = 16, 8, 4, 2 */
        for (int z = 0; z < h; z++) S[z] = _mm256_add_ps(S[z], S[z + h]);
    const __m256 v = _mm256_add_ps(S[0], _mm256_permute2f128_ps(S[0], S[0], 1));   /* h = 1 */
    _mm_storeu_ps(s, _mm256_castps256_ps128(v));
}
#else
static inline void scores4_at(const float *const *kr, const float *q, int64_t d, float *s, const int steps,
                              const int whole) {
    (void)whole;
    for (int j = 0; j < 4; j++) {
        float l[32];
        for (int lane = 0; lane < 32; lane++) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int c = 0; c < steps; c++)
                for (int e = 0; e < 4; e++) {
                    const int64_t col = 128 * c + 4 * lane + e;
                    acc[e] = acc[e] + (col < d ? q[col] * kr[j][col] : 0.0f * 0.0f);
                }
            l[lane] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        }
        for (int h = 16; h >= 1; h /= 2)
            for (int lane = 0; lane < h; lane++) l[lane] = l[lane] + l[lane + h];
        s[j] = l[0];
    }
}
#endif

/* Keys four at a time, outer (a key block is read from memory once), every query of them inner;
 * past the last key the last one is read again and not stored. */
void vk_scores(const float *k, int64_t ks, const float *q, int64_t qs, int64_t nq, float *out, int64_t os,
               int64_t nkeys, int64_t d, float scale) {
    for (int64_t t0 = 0; t0 < nkeys; t0 += 4) {
        const float *kr[4];
        for (int j = 0; j < 4; j++) kr[j] = k + (t0 + j < nkeys ? t0 + j : nkeys - 1) * ks;
        for (int64_t i = 0; i < nq; i++) {
            float s[4];
            if (d == 128) scores4_at(kr, q + i * qs, d, s, 1, 1);             /* Qwen3's heads */
            else if (d == 256) scores4_at(kr, q + i * qs, d, s, 2, 1);        /* Qwen3.5/3.6's, Gemma 3's */
            else scores4_at(kr, q + i * qs, d, s, (int)((d + 127) / 128), 0);
            for (int j = 0; j < 4 && t0 + j < nkeys; j++) out[i * os + t0 + j] = s[j] * scale;
        }
    }
}
