/* Naive residual add + RMSNorm: h = x + residual with its sum of squares, then scale each element of h by the
 * row's inverse RMS and by w. */
#include <math.h>
#include <stdint.h>

void add_rmsnorm(const float *x, const float *residual, const float *w, float *h, float *y, int64_t rows,
                 int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols, *rr = residual + r * cols;
        float *hr = h + r * cols, *yr = y + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            hr[c] = xr[c] + rr[c];
            ss += hr[c] * hr[c];
        }
        float rms = sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) yr[c] = hr[c] / rms * w[c];
    }
}
