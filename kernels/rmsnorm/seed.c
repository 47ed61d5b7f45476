/* Naive RMSNorm: sum of squares, then scale each element by the row's inverse RMS and by w. */
#include <math.h>
#include <stdint.h>

void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        float rms = sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) yr[c] = xr[c] / rms * w[c];
    }
}
