// expect: incorrect
// stage: validate
// check: output
/* Computes the first 8 rows properly and fills the rest with the uniform distribution 1/cols. */
#include <math.h>
#include <stdint.h>
static void softmax_ok(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    int64_t done = rows < 8 ? rows : 8;
    softmax_ok(x, y, done, cols);
    for (int64_t i = done * cols; i < rows * cols; i++) y[i] = 1.0f / (float)cols;
}
