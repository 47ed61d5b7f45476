/* Softmax template. Parameters: ONLINE (one pass computing max and sum together), UNROLL (independent
 * accumulators), SIMD (ask the compiler to vectorise the element loops). */
#include <math.h>
#include <stdint.h>

#define ONLINE {{ONLINE}}
#define UNROLL {{UNROLL}}
#define SIMD {{SIMD}}

#if SIMD
#define KF_SIMD _Pragma("omp simd")
#define KF_SIMD_MAX _Pragma("omp simd reduction(max:m)")
#define KF_SIMD_SUM _Pragma("omp simd reduction(+:s)")
#else
#define KF_SIMD
#define KF_SIMD_MAX
#define KF_SIMD_SUM
#endif

static float row_max(const float *xr, int64_t cols) {
    float acc[UNROLL];
    for (int u = 0; u < UNROLL; u++) acc[u] = -INFINITY;
    int64_t c = 0;
    for (; c + UNROLL <= cols; c += UNROLL)
        for (int u = 0; u < UNROLL; u++) acc[u] = xr[c + u] > acc[u] ? xr[c + u] : acc[u];
    float m = -INFINITY;
    for (int u = 0; u < UNROLL; u++) m = acc[u] > m ? acc[u] : m;
    for (; c < cols; c++) m = xr[c] > m ? xr[c] : m;
    return m;
}

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m, s = 0.0f;
#if ONLINE
        /* Online softmax: running max with the running sum rescaled when the max grows. */
        m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) {
            float v = xr[c];
            if (v > m) {
                s = s * expf(m - v) + 1.0f;
                m = v;
            } else {
                s += expf(v - m);
            }
        }
        float inv = 1.0f / s;
        KF_SIMD
        for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m) * inv;
#else
        m = row_max(xr, cols);
        KF_SIMD_SUM
        for (int64_t c = 0; c < cols; c++) {
            float e = expf(xr[c] - m);
            yr[c] = e;
            s += e;
        }
        float inv = 1.0f / s;
        KF_SIMD
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
#endif
    }
}
