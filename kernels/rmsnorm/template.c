/* RMSNorm template. Parameters:
 *   ACC    independent partial sums of squares per row (1: one running sum)
 *   ROWS   rows normalised together, interleaving their reductions (helps short rows)
 *   SIMD   ask the compiler to vectorise with omp simd reductions (only with ACC == 1)
 *   FUSED  1: the reduction pass also stores x * w, the second pass scales y in place;
 *          0: the second pass reads x and w again (two-pass)
 *   VEC    preferred vector width in bits for the compiler (256 or 512)
 *   NT     1: the final pass writes y with non-temporal (streaming) stores, which skip reading y's
 *          cache lines from memory first; pays off when y does not fit in cache (AVX/AVX-512 only,
 *          plain stores elsewhere)
 */
#include <math.h>
#include <stdint.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#define ACC {{ACC}}
#define ROWS {{ROWS}}
#define SIMD {{SIMD}}
#define FUSED {{FUSED}}
#define VEC {{VEC}}
#define NT {{NT}}

#if VEC == 512
#pragma GCC target("prefer-vector-width=512")
#else
#pragma GCC target("prefer-vector-width=256")
#endif

#if SIMD
#define KF_SIMD _Pragma("omp simd")
#define KF_SIMD_SUM _Pragma("omp simd reduction(+:ss)")
#else
#define KF_SIMD
#define KF_SIMD_SUM
#endif

/* Sum of squares of one row; when FUSED, also writes x * w to yr. */
static inline float sum_squares(const float *restrict xr, const float *restrict w, float *restrict yr,
                                int64_t cols) {
#if !FUSED
    (void)w;
    (void)yr;
#endif
#if ACC == 1
    float ss = 0.0f;
    KF_SIMD_SUM
    for (int64_t c = 0; c < cols; c++) {
        ss += xr[c] * xr[c];
#if FUSED
        yr[c] = xr[c] * w[c];
#endif
    }
    return ss;
#else
    float acc[ACC];
    for (int u = 0; u < ACC; u++) acc[u] = 0.0f;
    int64_t c = 0;
    for (; c + ACC <= cols; c += ACC) {
        for (int u = 0; u < ACC; u++) {
            acc[u] += xr[c + u] * xr[c + u];
#if FUSED
            yr[c + u] = xr[c + u] * w[c + u];
#endif
        }
    }
    float ss = 0.0f;
    for (int u = 0; u < ACC; u++) ss += acc[u];
    for (; c < cols; c++) {
        ss += xr[c] * xr[c];
#if FUSED
        yr[c] = xr[c] * w[c];
#endif
    }
    return ss;
#endif
}

#if FUSED
#define KF_OUT(c) (yr[c] * inv)
#else
#define KF_OUT(c) (xr[c] * inv * w[c])
#endif

static inline void scale_row(const float *restrict xr, const float *restrict w, float *restrict yr,
                             int64_t cols, float inv) {
    (void)xr;
    (void)w;
    int64_t c = 0;
#if NT && (defined(__AVX512F__) || defined(__AVX__))
#if defined(__AVX512F__)
#define KF_LANES 16
#else
#define KF_LANES 8
#endif
    /* Streaming stores need aligned addresses: plain stores up to the first aligned element. */
    for (; c < cols && ((uintptr_t)(yr + c) % (4 * KF_LANES)) != 0; c++) yr[c] = KF_OUT(c);
    for (; c + KF_LANES <= cols; c += KF_LANES) {
#if defined(__AVX512F__)
#if FUSED
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(yr + c), _mm512_set1_ps(inv));
#else
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + c), _mm512_set1_ps(inv)),
                                 _mm512_loadu_ps(w + c));
#endif
        _mm512_stream_ps(yr + c, v);
#else
#if FUSED
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(yr + c), _mm256_set1_ps(inv));
#else
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + c), _mm256_set1_ps(inv)),
                                 _mm256_loadu_ps(w + c));
#endif
        _mm256_stream_ps(yr + c, v);
#endif
    }
#endif
    KF_SIMD
    for (int64_t i = c; i < cols; i++) yr[i] = KF_OUT(i);
}

void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    const float inv_cols = 1.0f / (float)cols;
    int64_t r = 0;
    for (; r + ROWS <= rows; r += ROWS) {
        float inv[ROWS];
        for (int i = 0; i < ROWS; i++) {
            float ss = sum_squares(x + (r + i) * cols, w, y + (r + i) * cols, cols);
            inv[i] = 1.0f / sqrtf(ss * inv_cols + eps);
        }
        for (int i = 0; i < ROWS; i++) scale_row(x + (r + i) * cols, w, y + (r + i) * cols, cols, inv[i]);
    }
    for (; r < rows; r++) {
        float ss = sum_squares(x + r * cols, w, y + r * cols, cols);
        scale_row(x + r * cols, w, y + r * cols, cols, 1.0f / sqrtf(ss * inv_cols + eps));
    }
#if NT && defined(__AVX__)
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible before returning */
#endif
}
