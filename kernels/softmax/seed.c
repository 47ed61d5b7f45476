/* Naive three-pass softmax: max, then sum of exponentials, then normalise. */
#include <math.h>
#include <stdint.h>

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        float s = 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            yr[c] = expf(xr[c] - m);
            s += yr[c];
        }
        for (int64_t c = 0; c < cols; c++) yr[c] = yr[c] / s;
    }
}
