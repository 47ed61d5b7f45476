/* Softmax template. Parameters:
 *   ONLINE  0: three passes over the row (max; exponentials and their sum; scale).
 *           1: two passes, blocked online softmax: for each chunk of 16 * UNROLL elements, its max
 *           rescales the running sum when it grows, and the chunk's exponentials are stored relative to
 *           the max known then; the second pass rescales each chunk to the row's max and divides by the sum.
 *   UNROLL  ONLINE 0: independent accumulators of the max pass; ONLINE 1: chunk length in 16s
 *   SIMD    1: vectorise the element loops with omp simd and an inline exp (a Cody-Waite reduction and a
 *           degree-6 Taylor polynomial, relative error ~2e-7) that involves no library call;
 *           0: plain loops calling expf
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ONLINE {{ONLINE}}
#define UNROLL {{UNROLL}}
#define SIMD {{SIMD}}

#if SIMD
#define KF_SIMD _Pragma("omp simd")
#define KF_SIMD_SUM _Pragma("omp simd reduction(+:s)")
#define KF_SIMD_MAX_CHUNK _Pragma("omp simd reduction(max:cm)")
#define KF_SIMD_SUM_CHUNK _Pragma("omp simd reduction(+:cs)")

/* exp(x) for x <= 0: x = n ln2 + f with |f| <= ln2/2, exp(f) by Taylor to degree 6, 2^n from the exponent
 * bits. Below -87 the result would not be a normal float; it is then ~1e-38 instead of ~0. */
static inline float kf_exp(float x) {
    x = fmaxf(x, -87.0f);
    float n = rintf(x * 1.44269504f);
    float f = fmaf(n, -0.693359375f, x); /* ln2 split in two so that n * hi is exact */
    f = fmaf(n, 2.12194440e-4f, f);
    float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f * (1.0f / 720))))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}
#else
#define KF_SIMD
#define KF_SIMD_SUM
#define KF_SIMD_MAX_CHUNK
#define KF_SIMD_SUM_CHUNK
#define kf_exp expf
#endif

#if !ONLINE
static float row_max(const float *xr, int64_t cols) {
    float acc[UNROLL];
    for (int u = 0; u < UNROLL; u++) acc[u] = xr[0];
    int64_t c = 0;
    for (; c + UNROLL <= cols; c += UNROLL)
        for (int u = 0; u < UNROLL; u++) acc[u] = xr[c + u] > acc[u] ? xr[c + u] : acc[u];
    float m = acc[0];
    for (int u = 1; u < UNROLL; u++) m = acc[u] > m ? acc[u] : m;
    for (; c < cols; c++) m = xr[c] > m ? xr[c] : m;
    return m;
}
#endif

#if ONLINE
#define CHUNK (16 * UNROLL)

static void softmax_row(const float *xr, float *yr, int64_t cols, float *chunk_max) {
    float m = xr[0], s = 0.0f;
    for (int64_t c0 = 0, b = 0; c0 < cols; c0 += CHUNK, b++) {
        const int64_t n = cols - c0 < CHUNK ? cols - c0 : CHUNK;
        const float *xc = xr + c0;
        float *yc = yr + c0;
        float cm = xc[0];
        KF_SIMD_MAX_CHUNK
        for (int64_t c = 0; c < n; c++) cm = xc[c] > cm ? xc[c] : cm;
        if (cm > m) {
            s *= kf_exp(m - cm);
            m = cm;
        }
        chunk_max[b] = m;
        float cs = 0.0f;
        KF_SIMD_SUM_CHUNK
        for (int64_t c = 0; c < n; c++) {
            float e = kf_exp(xc[c] - m);
            yc[c] = e;
            cs += e;
        }
        s += cs;
    }
    const float inv = 1.0f / s;
    for (int64_t c0 = 0, b = 0; c0 < cols; c0 += CHUNK, b++) {
        const int64_t n = cols - c0 < CHUNK ? cols - c0 : CHUNK;
        const float f = kf_exp(chunk_max[b] - m) * inv;
        float *yc = yr + c0;
        KF_SIMD
        for (int64_t c = 0; c < n; c++) yc[c] *= f;
    }
}
#endif

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (cols <= 0) return;
#if ONLINE
    /* The max in force when each chunk was written, to rescale it in the second pass. */
    float *chunk_max = malloc((size_t)((cols + CHUNK - 1) / CHUNK) * sizeof(float));
    if (chunk_max == NULL) return; /* out of memory: y stays unwritten and the harness says incorrect */
    for (int64_t r = 0; r < rows; r++) softmax_row(x + r * cols, y + r * cols, cols, chunk_max);
    free(chunk_max);
#else
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = row_max(xr, cols), s = 0.0f;
        KF_SIMD_SUM
        for (int64_t c = 0; c < cols; c++) {
            float e = kf_exp(xr[c] - m);
            yr[c] = e;
            s += e;
        }
        float inv = 1.0f / s;
        KF_SIMD
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
#endif
}
