/* Naive LayerNorm: the row's mean, then its variance about the mean, then y = (x - mean) / sqrt(var + eps) * w + b.
 * The sums are doubles: one float summing a long row whose mean is large next to its spread is off by more than
 * the tolerance, unless the compiler splits it into vector lanes (it may not). */
#include <math.h>
#include <stdint.h>

void layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        double sum = 0.0;
        for (int64_t c = 0; c < cols; c++) sum += xr[c];
        const float mean = (float)(sum / (double)cols);
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) ss += (double)((xr[c] - mean) * (xr[c] - mean));
        const float sd = sqrtf((float)(ss / (double)cols) + eps);
        for (int64_t c = 0; c < cols; c++) yr[c] = (xr[c] - mean) / sd * w[c] + b[c];
    }
}
