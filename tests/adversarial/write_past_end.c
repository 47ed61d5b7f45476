// expect: incorrect
// stage: validate
// check: guard_after
/* Correct, then writes one float past the end of the output (an off-by-one tail loop). */
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
    softmax_ok(x, y, rows, cols);
    y[rows * cols] = 0.0f;
}
